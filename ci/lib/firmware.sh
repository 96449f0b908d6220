# Firmware for aarch64 QEMU boot tests (sourced): the same disk image under EDK2
# (AAVMF: systemd-boot counts tries by renaming entries) or under U-Boot (Debian's
# u-boot-qemu 2023.01: distro boot runs the ESP's /boot.scr, which counts tries itself,
# because U-Boot's EFI file protocol refuses systemd-boot's renames).
#
#   . ci/lib/qemu.sh; . ci/lib/firmware.sh   # serial_panicked comes from qemu.sh
#   fw_args aavmf|uboot RUNDIR      # -> FW_ARGS (QEMU arguments); RUNDIR keeps the
#                                   #    writable AAVMF variable store (fresh per call)
#   fw_boot FW DISK LOG SECONDS UNTIL_FN [QEMU args...]
#                                   # boot DISK under FW (virt, cortex-a57, TCG, user net,
#                                   # -no-reboot: a guest reboot ends QEMU), serial to LOG,
#                                   # until UNTIL_FN LOG succeeds, QEMU exits, a panic
#                                   # or SECONDS; sets FW_STATUS (0 done or exited,
#                                   # 3 panic, 4 timeout) and FW_SECS
#   fw_name FW                      # what the log calls it
#
# Never -cpu max under TCG (pointer authentication is slow): -cpu cortex-a57.
FW_UBOOT=${RG_UBOOT_BIN:-/usr/lib/u-boot/qemu_arm64/u-boot.bin}
FW_AAVMF_CODE=${RG_AAVMF_CODE:-/usr/share/AAVMF/AAVMF_CODE.fd}
FW_AAVMF_VARS=${RG_AAVMF_VARS:-/usr/share/AAVMF/AAVMF_VARS.fd}
FW_MACHINE=(-accel tcg -machine virt -cpu cortex-a57 -smp 2 -m 768 -nographic -no-reboot)

fw_name() {
    case $1 in
        aavmf) echo "AAVMF (EDK2, systemd-boot)" ;;
        uboot) echo "U-Boot $(dpkg-query -W -f '${Version}' u-boot-qemu 2>/dev/null) (distro boot, /boot.scr)" ;;
        *) echo "$1" ;;
    esac
}

fw_args() { # FW RUNDIR
    FW_ARGS=()
    case $1 in
        aavmf)
            [ -f "$FW_AAVMF_CODE" ] || { echo "firmware: no $FW_AAVMF_CODE (qemu-efi-aarch64; ci/deps.sh)" >&2; return 1; }
            mkdir -p "$2" && cp "$FW_AAVMF_VARS" "$2/aavmf-vars.fd" || return 1
            FW_ARGS=(-drive "if=pflash,format=raw,unit=0,readonly=on,file=$FW_AAVMF_CODE"
                     -drive "if=pflash,format=raw,unit=1,file=$2/aavmf-vars.fd") ;;
        uboot)
            [ -f "$FW_UBOOT" ] || { echo "firmware: no $FW_UBOOT (u-boot-qemu; ci/deps.sh)" >&2; return 1; }
            # U-Boot's environment is not saved (no pflash): its default distro bootcmd
            # runs every time, as on a board whose environment was never changed.
            FW_ARGS=(-bios "$FW_UBOOT") ;;
        *) echo "firmware: $1 is aavmf or uboot" >&2; return 1 ;;
    esac
}

fw_boot() { # FW DISK LOG SECONDS UNTIL_FN [QEMU args...]
    local fw=$1 disk=$2 log=$3 secs=$4 until=$5 t0=$SECONDS pid run
    shift 5
    run=$(mktemp -d "${TMPDIR:-/tmp}/rg-fw.XXXXXX")
    fw_args "$fw" "$run" || { rm -rf "$run"; FW_STATUS=1; return 1; }
    : >"$log"
    qemu-system-aarch64 "${FW_MACHINE[@]}" "${FW_ARGS[@]}" \
        -drive "if=none,id=disk0,format=raw,file=$disk" -device virtio-blk-pci,drive=disk0 \
        -netdev user,id=n0 -device virtio-net-pci,netdev=n0,mac=52:54:00:12:34:56 \
        -device virtio-rng-pci "$@" </dev/null >"$log" 2>&1 &
    pid=$!
    FW_STATUS=4
    while :; do
        if ! kill -0 "$pid" 2>/dev/null; then FW_STATUS=0; break; fi
        if serial_panicked "$log"; then FW_STATUS=3; break; fi
        if "$until" "$log"; then FW_STATUS=0; break; fi
        if [ $((SECONDS - t0)) -gt "$secs" ]; then break; fi
        sleep 0.5
    done
    kill "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
    rm -rf "$run"
    FW_SECS=$((SECONDS - t0))
}
