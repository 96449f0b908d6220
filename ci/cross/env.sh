# Sourced by ci/cross/build-image.sh and ci/test-cross.sh: where podman keeps the cross
# image and how it runs containers on these machines (ci/cross/containers.conf). The
# storage lives under /var/lib/riceguard-cross (graph) and /run/riceguard-cross (locks,
# recreated by podman when missing), apart from any system podman state.
RG_CROSS_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
RG_CROSS_IMAGE=localhost/riceguard-cross:bookworm   # Cross.toml names the same image
RG_CROSS_STATE=/var/lib/riceguard-cross       # storage.conf's graphroot is under it
export CONTAINERS_CONF=$RG_CROSS_DIR/containers.conf
export CONTAINERS_STORAGE_CONF=$RG_CROSS_DIR/storage.conf
export CROSS_CONTAINER_ENGINE=podman
# The recipe's hash: the image carries it as a label, a changed recipe means a rebuild.
rg_cross_recipe_hash() {
    (cd "$RG_CROSS_DIR" && cat build-image.sh aarch64-linux-musl-gcc | sha256sum | cut -c1-16)
}
# The label of the image in storage ("" when there is none).
rg_cross_image_hash() {
    podman image inspect --format '{{index .Labels "riceguard.recipe"}}' "$RG_CROSS_IMAGE" 2>/dev/null || true
}
# cross 0.2.5 misreads rustup 1.28+'s toolchain list: ci/cross/bin/rustup fixes that one call.
case ":$PATH:" in *":$RG_CROSS_DIR/bin:"*) ;; *) export PATH=$RG_CROSS_DIR/bin:$PATH ;; esac
CROSS_VERSION=0.2.5   # ci/deps.sh installs exactly this one (cargo install --locked)
