# RiceGuard A/B boot for U-Boot boards (image/uboot/boot.cmd; image/build.sh makes the
# ESP's /boot.scr from it with mkimage). U-Boot's distro boot runs it from the ESP before
# it would try EFI/BOOT/BOOTAA64.EFI (systemd-boot). U-Boot's EFI file protocol refuses
# renames, so under U-Boot systemd-boot cannot count tries: this script does systemd-boot's
# boot counting itself, on the same entry files (/loader/entries/riceguard-X[+L[-D]].conf:
# the one source of truth for both firmware paths), then starts the chosen slot's UKI
# with bootefi. EDK2 firmware never runs it and keeps using systemd-boot.
#
# Choice (systemd-boot's order for our entries): entries with tries left or no counter
# before entries with none left (+0-D), then sort-key riceguard-0 before riceguard-1
# (the key is the entry's last line: slots.rs keeps it there), then slot a before b.
# A trial entry is counted down (+L-D -> +(L-1)-(D+1): fatwrite the new name, then fatrm
# the old; tries done stops at 3, the most it probes for) before its kernel runs, so a
# kernel that never reaches init still uses a try.
# A power cut between the two leaves both names: the next run picks the old one (most
# tries left first) and redoes the same step. If the count cannot be written, the trial
# slot is not booted (the other slot is), so an update is never tried uncounted.
# The choice is told to the booted system in a volatile EFI variable, RiceGuardBoot.
setenv rg_guid 8e4b3f5a-1c2d-4e6f-9a0b-52696365476d
setenv rg_buf ${ramdisk_addr_r}
setenv rg_e /loader/entries
echo "riceguard-uboot: A/B boot script on ${devtype} ${devnum}:${distro_bootpart}"

# rg_find: rg_s (a|b) -> rg_n (entry name or empty), rg_l (tries left, g: no counter),
# rg_d (tries done), rg_score (lower boots first; 99: no entry).
setenv rg_find 'setenv rg_n; setenv rg_l; setenv rg_d; setenv rg_score 99; for l in 3 2 1 0; do for d in 0 1 2 3; do if test ${d} = 0; then setenv rg_c ${l}; else setenv rg_c ${l}-${d}; fi; if test -z "${rg_n}"; then if test -e ${devtype} ${devnum}:${distro_bootpart} ${rg_e}/riceguard-${rg_s}+${rg_c}.conf; then setenv rg_n riceguard-${rg_s}+${rg_c}.conf; setenv rg_l ${l}; setenv rg_d ${d}; fi; fi; done; done; if test -z "${rg_n}"; then if test -e ${devtype} ${devnum}:${distro_bootpart} ${rg_e}/riceguard-${rg_s}.conf; then setenv rg_n riceguard-${rg_s}.conf; setenv rg_l g; setenv rg_d 0; fi; fi; if test -n "${rg_n}"; then run rg_key; fi'
# rg_key: the sort-key digit of rg_n (the byte before the final newline) -> rg_score.
setenv rg_key 'setenv rg_score 2; if size ${devtype} ${devnum}:${distro_bootpart} ${rg_e}/${rg_n}; then setexpr rg_pos ${filesize} - 2; mw.b ${rg_buf} 0 1; if load ${devtype} ${devnum}:${distro_bootpart} ${rg_buf} ${rg_e}/${rg_n} 1 ${rg_pos}; then setexpr.b rg_k *${rg_buf}; if test "${rg_k}" = 30; then setenv rg_score 0; elif test "${rg_k}" = 31; then setenv rg_score 1; fi; fi; fi; if test "${rg_l}" = 0; then setexpr rg_score ${rg_score} + 4; fi'

setenv rg_s a; run rg_find; setenv rg_n_a ${rg_n}; setenv rg_l_a ${rg_l}; setenv rg_d_a ${rg_d}; setenv rg_score_a ${rg_score}
setenv rg_s b; run rg_find; setenv rg_n_b ${rg_n}; setenv rg_l_b ${rg_l}; setenv rg_d_b ${rg_d}; setenv rg_score_b ${rg_score}
echo "riceguard-uboot: slot a: ${rg_n_a} (score ${rg_score_a}); slot b: ${rg_n_b} (score ${rg_score_b})"

# rg_pick: rg_s -> rg_n rg_l rg_d of that slot, rg_o the other slot.
setenv rg_pick 'if test ${rg_s} = a; then setenv rg_n ${rg_n_a}; setenv rg_l ${rg_l_a}; setenv rg_d ${rg_d_a}; setenv rg_o b; else setenv rg_n ${rg_n_b}; setenv rg_l ${rg_l_b}; setenv rg_d ${rg_d_b}; setenv rg_o a; fi'
# rg_count: count rg_n's try down; rg_counted=1 when done (or not a trial).
setenv rg_count 'setenv rg_counted 1; if test "${rg_l}" != g; then if test ${rg_l} != 0; then setenv rg_counted 0; setexpr rg_l2 ${rg_l} - 1; setexpr rg_d2 ${rg_d} + 1; if test ${rg_d2} = 4; then setenv rg_d2 3; fi; setenv rg_new riceguard-${rg_s}+${rg_l2}-${rg_d2}.conf; if load ${devtype} ${devnum}:${distro_bootpart} ${rg_buf} ${rg_e}/${rg_n}; then if fatwrite ${devtype} ${devnum}:${distro_bootpart} ${rg_buf} ${rg_e}/${rg_new} ${filesize}; then if fatrm ${devtype} ${devnum}:${distro_bootpart} ${rg_e}/${rg_n}; then echo "riceguard-uboot: slot ${rg_s} on trial: ${rg_n} -> ${rg_new}"; setenv rg_n ${rg_new}; setenv rg_counted 1; fi; fi; fi; fi; fi'
# rg_boot: start slot rg_s's UKI (returns only if that failed).
setenv rg_boot 'env set -e -bs -rt -guid ${rg_guid} RiceGuardBoot "uboot ${rg_s} ${rg_n}"; if load ${devtype} ${devnum}:${distro_bootpart} ${kernel_addr_r} /EFI/riceguard/slot-${rg_s}.efi; then echo "riceguard-uboot: booting slot ${rg_s} (${rg_n})"; bootefi ${kernel_addr_r} ${fdtcontroladdr}; fi; echo "riceguard-uboot: slot ${rg_s} did not start"'

if itest ${rg_score_b} < ${rg_score_a}; then setenv rg_s b; else setenv rg_s a; fi
run rg_pick
if test -z "${rg_n}"; then
    echo "riceguard-uboot: no RiceGuard boot entry: leaving it to the EFI boot path"
    exit
fi
if test "${rg_l}" = 0; then
    echo "riceguard-uboot: FALLBACK: no slot has tries left; booting slot ${rg_s} (${rg_n}) anyway"
fi
run rg_count
if test ${rg_counted} = 0; then
    echo "riceguard-uboot: cannot count down ${rg_n} on the ESP: not trying slot ${rg_s}, booting slot ${rg_o}"
    setenv rg_s ${rg_o}; run rg_pick
    if test -n "${rg_n}"; then run rg_boot; fi
    exit
fi
run rg_boot
# The chosen UKI did not start: the other slot, if it has an entry (uncounted: last resort).
setenv rg_s ${rg_o}; run rg_pick
if test -n "${rg_n}"; then run rg_boot; fi
