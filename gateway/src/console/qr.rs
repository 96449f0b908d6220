//! A QR code drawn with Unicode half blocks, for the serial console: `add client` and
//! `show client` print the client's configuration this way so a phone's WireGuard app
//! scans it off the screen.
//!
//! Encoding is the `qrcode` crate's (error correction level L: a screen does not smudge,
//! and the lowest level keeps a whole client configuration at version 13 or so, 77
//! columns with the quiet zone, inside an 80-column terminal). Drawing is done here:
//! two module rows per text line (`▀` upper, `▄` lower, `█` both, space neither), a quiet
//! zone of [`QUIET`] modules all round.
//!
//! Colours: the characters are drawn in the terminal's text colour, so *light* modules
//! (and the quiet zone) are the blocks and *dark* modules are spaces. On a serial console
//! (light text on a dark background, the usual default) that shows dark modules on a
//! light field, which is what phone scanners expect. A terminal set to dark text on a
//! light background shows it inverted.

use qrcode::{EcLevel, QrCode};

/// Light modules around the code, as the QR specification asks.
pub const QUIET: usize = 4;

/// Both module rows of the cell light.
pub const FULL: char = '█';
/// Only the upper module row light.
pub const UPPER: char = '▀';
/// Only the lower module row light.
pub const LOWER: char = '▄';
/// Both dark.
pub const NONE: char = ' ';

/// `text` as a QR code, one string of lines (each ends with `\n`). Fails only when the
/// text is too long for any QR version.
pub fn render(text: &str) -> Result<String, String> {
    let code = QrCode::with_error_correction_level(text.as_bytes(), EcLevel::L).map_err(|e| {
        format!(
            "the configuration ({} bytes) does not fit in a QR code: {e}",
            text.len()
        )
    })?;
    let w = code.width();
    let dark: Vec<bool> = code
        .to_colors()
        .iter()
        .map(|c| *c == qrcode::Color::Dark)
        .collect();
    Ok(draw(w, &dark))
}

/// The module count per side of the code [`render`] draws for `text` (without the quiet
/// zone), and its QR version.
pub fn size(text: &str) -> Option<(usize, i16)> {
    let code = QrCode::with_error_correction_level(text.as_bytes(), EcLevel::L).ok()?;
    let v = match code.version() {
        qrcode::Version::Normal(v) | qrcode::Version::Micro(v) => v,
    };
    Some((code.width(), v))
}

/// Draw a `w` x `w` module matrix (`dark[y * w + x]`, true = dark) with the quiet zone.
/// Modules outside the matrix are light; the half row below the last one (the total
/// height is odd) is dark, i.e. nothing is drawn there.
pub fn draw(w: usize, dark: &[bool]) -> String {
    let side = w + 2 * QUIET;
    // Light = inside the drawn square and not a dark module of the code.
    let light = |x: usize, y: usize| -> bool {
        if y >= side {
            return false;
        }
        if x < QUIET || y < QUIET || x >= QUIET + w || y >= QUIET + w {
            return true;
        }
        !dark
            .get((y - QUIET) * w + (x - QUIET))
            .copied()
            .unwrap_or(false)
    };
    let mut out = String::with_capacity((side + 1) * side.div_ceil(2) * 3);
    for row in (0..side).step_by(2) {
        for x in 0..side {
            out.push(match (light(x, row), light(x, row + 1)) {
                (true, true) => FULL,
                (true, false) => UPPER,
                (false, true) => LOWER,
                (false, false) => NONE,
            });
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Read the drawing back into light/dark modules (the inverse of [`draw`]).
    fn modules(drawing: &str) -> Vec<Vec<bool>> {
        let mut rows = Vec::new();
        for line in drawing.lines() {
            let (mut top, mut bottom) = (Vec::new(), Vec::new());
            for c in line.chars() {
                let (t, b) = match c {
                    FULL => (true, true),
                    UPPER => (true, false),
                    LOWER => (false, true),
                    NONE => (false, false),
                    other => panic!("unexpected character {other:?}"),
                };
                top.push(t);
                bottom.push(b);
            }
            rows.push(top);
            rows.push(bottom);
        }
        rows
    }

    #[test]
    fn structure_matches_the_version_and_quiet_zone() {
        let text = "[Interface]\nPrivateKey = aaaa\nAddress = 10.100.0.2/32\n";
        let (w, version) = size(text).unwrap();
        assert_eq!(w, 4 * version as usize + 17, "a normal QR code");
        let d = render(text).unwrap();
        let side = w + 2 * QUIET;
        let lines: Vec<&str> = d.lines().collect();
        assert_eq!(lines.len(), side.div_ceil(2), "two module rows per line");
        for l in &lines {
            assert_eq!(l.chars().count(), side);
            assert!(l.chars().all(|c| [FULL, UPPER, LOWER, NONE].contains(&c)));
        }
        let m = modules(&d);
        // Quiet zone: all light on every side.
        for (y, row) in m.iter().take(side).enumerate() {
            assert_eq!(row.len(), side);
            for (x, light) in row.iter().enumerate() {
                let border = x < QUIET || y < QUIET || x >= QUIET + w || y >= QUIET + w;
                if border {
                    assert!(light, "quiet zone module ({x},{y}) is dark");
                }
            }
        }
        // The half row past the bottom is not drawn (odd height).
        assert!(m[side].iter().all(|l| !l));
        // Finder patterns: a dark 7x7 ring with a light ring inside and a dark 3x3 core,
        // at three corners.
        for (ox, oy) in [(0, 0), (w - 7, 0), (0, w - 7)] {
            for dy in 0..7 {
                for dx in 0..7 {
                    let ring = dx == 0 || dy == 0 || dx == 6 || dy == 6;
                    let core = (2..=4).contains(&dx) && (2..=4).contains(&dy);
                    let dark = !m[QUIET + oy + dy][QUIET + ox + dx];
                    assert_eq!(dark, ring || core, "finder at ({ox},{oy}) +({dx},{dy})");
                }
            }
        }
        // Timing pattern on row 6 between the finders: alternating, dark first.
        for x in 8..w - 8 {
            assert_eq!(!m[QUIET + 6][QUIET + x], x % 2 == 0, "timing at x={x}");
        }
    }

    #[test]
    fn deterministic_and_depends_on_the_text() {
        let a = render("[Peer]\nPublicKey = x\n").unwrap();
        assert_eq!(a, render("[Peer]\nPublicKey = x\n").unwrap());
        assert_ne!(a, render("[Peer]\nPublicKey = y\n").unwrap());
    }

    #[test]
    fn draw_maps_module_pairs_to_blocks() {
        // A 1x1 "code": one dark module at (QUIET, QUIET).
        let d = draw(1, &[true]);
        let lines: Vec<&str> = d.lines().collect();
        let side = 1 + 2 * QUIET;
        assert_eq!(lines.len(), side.div_ceil(2));
        // Rows 4 (dark module) and 5 (quiet) share line 2: lower half light there.
        let l2: Vec<char> = lines[2].chars().collect();
        assert_eq!(l2[QUIET], LOWER);
        assert_eq!(l2[0], FULL);
        // Last line: row 8 light, row 9 outside the square.
        assert!(lines[4].chars().all(|c| c == UPPER));
        let light = draw(1, &[false]);
        assert!(light.lines().take(4).all(|l| l.chars().all(|c| c == FULL)));
    }

    #[test]
    fn too_long_is_an_error_not_a_panic() {
        let e = render(&"x".repeat(4000)).unwrap_err();
        assert!(e.contains("does not fit"), "{e}");
    }

    /// The drawing, read back as a light-on-dark terminal shows it (blocks light, spaces
    /// dark) and scanned by a real decoder, gives the text back.
    #[test]
    #[ignore = "needs zbarimg (Debian zbar-tools, ci/deps.sh): ci/test.sh unit runs it with --include-ignored"]
    fn a_real_decoder_reads_it_back() {
        let out = std::process::Command::new("zbarimg")
            .arg("--version")
            .output()
            .expect("zbarimg (apt-get install zbar-tools)");
        assert!(out.status.success());
        let k = "yAnz5TF+lXXJte14tji3zlMNq+hd2rYUIgJBgB3fBmk=";
        let text = format!(
            "[Interface]\nPrivateKey = {k}\nAddress = 10.100.0.2/32, fd10::2/128\nDNS = 192.168.1.1\n\
             [Peer]\nPublicKey = {k}\nPresharedKey = {k}\n\
             AllowedIPs = 10.100.0.0/24, fd10::/64, 192.168.1.0/24\nEndpoint = vpn.example.net:51820\n\
             PersistentKeepalive = 25\n"
        );
        let m = modules(&render(&text).unwrap());
        const S: usize = 4; // pixels per module
        let (w, h) = (m[0].len() * S, m.len() * S);
        let mut pbm = format!("P1\n{w} {h}\n");
        for row in &m {
            let line: String = row
                .iter()
                .flat_map(|light| std::iter::repeat_n(if *light { "0 " } else { "1 " }, S))
                .collect();
            for _ in 0..S {
                pbm.push_str(&line);
                pbm.push('\n');
            }
        }
        let d = crate::testutil::TempDir::new("qr-decode");
        let f = d.0.join("qr.pbm");
        std::fs::write(&f, pbm).unwrap();
        let out = std::process::Command::new("zbarimg")
            .args(["--raw", "-q"])
            .arg(&f)
            .output()
            .unwrap();
        assert!(out.status.success(), "zbarimg found no code: {out:?}");
        let got = String::from_utf8(out.stdout).unwrap();
        assert_eq!(got.strip_suffix('\n').unwrap_or(&got), text);
    }

    /// A full client configuration stays within an 80-column terminal.
    #[test]
    fn a_client_configuration_fits_80_columns() {
        let k = "yAnz5TF+lXXJte14tji3zlMNq+hd2rYUIgJBgB3fBmk=";
        let text = format!(
            "[Interface]\nPrivateKey = {k}\nAddress = 10.100.0.254/32\nDNS = 192.168.100.1\n\
             [Peer]\nPublicKey = {k}\nPresharedKey = {k}\n\
             AllowedIPs = 10.100.0.0/24, 192.168.100.0/24\nEndpoint = 203.0.113.200:51820\n\
             PersistentKeepalive = 25\n"
        );
        let (w, _) = size(&text).unwrap();
        assert!(w + 2 * QUIET <= 80, "{} columns", w + 2 * QUIET);
    }
}
