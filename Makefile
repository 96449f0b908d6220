# RiceGuard entry points. Each target is a thin wrapper over a script so the
# scripts stay runnable on their own; see README.md.
BOARD ?= qemu-x86_64
ARCH ?= x86_64

.PHONY: all static test test-unit test-interop test-image test-update image bundle qemu bench fuzz deps clean

all: static

# Install what a fresh machine lacks (apt packages, rustup targets, peer daemons).
deps:
	ci/deps.sh

# Static musl binaries for both architectures: target/<triple>/release/riceguard
static:
	ci/build-static.sh x86_64 aarch64

test:
	ci/test.sh

test-unit:
	ci/test.sh unit

test-interop:
	ci/test.sh interop

test-image:
	ci/test.sh image

image:
	image/build.sh $(BOARD)

# Signed update bundle of the same build: out/<board>/riceguard-<board>-<version>.bundle
bundle: image
	image/bundle.sh $(BOARD)

# Flash script and A/B update tests (host, then QEMU)
test-update:
	ci/test-update.sh

qemu:
	image/qemu.sh $(BOARD)

bench:
	ci/bench.sh

fuzz:
	ci/fuzz.sh

clean:
	cargo clean
	rm -rf out
