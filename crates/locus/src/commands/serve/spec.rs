//! `--export NAME=fs:/PATH[,size=SIZE][,ro]`, parsed into an [`ExportSpec`].

use exports::ExportSpec;

/// Parses `--export NAME=fs:/PATH[,size=SIZE][,ro]`.
pub fn parse(text: &str) -> Result<ExportSpec, String> {
    let (name, rest) = text
        .split_once('=')
        .ok_or_else(|| format!("{text:?}: expected NAME=fs:/PATH[,size=SIZE][,ro]"))?;
    if name.is_empty() || name.len() > nbd::consts::MAX_STRING_BYTES {
        return Err(format!("{text:?}: the export name must be 1 to 4096 bytes"));
    }
    let mut parts = rest.split(',');
    let target = parts.next().unwrap_or_default();
    let path = target
        .strip_prefix("fs:")
        .ok_or_else(|| format!("{text:?}: the export must be a file system path, fs:/PATH"))?;
    if !path.starts_with('/') || path == "/" {
        return Err(format!(
            "{text:?}: {path:?} is not an absolute file path in the file system"
        ));
    }
    let mut spec = ExportSpec {
        name: name.to_owned(),
        path: path.to_owned(),
        size: None,
        read_only: false,
    };
    for part in parts {
        match part.split_once('=') {
            Some(("size", size)) => {
                let size = crate::size::parse_size(size).map_err(|e| format!("{text:?}: {e}"))?;
                spec.size = Some(exports::check_size(size).map_err(|e| format!("{text:?}: {e}"))?);
            }
            None if part == "ro" => spec.read_only = true,
            None if part == "rw" => spec.read_only = false,
            _ => {
                return Err(format!(
                    "{text:?}: unknown setting {part:?} (size=SIZE, ro)"
                ));
            }
        }
    }
    Ok(spec)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn export_specs_parse_and_bad_ones_are_named() {
        assert_eq!(
            parse("disk=fs:/vm/disk.img,size=2G,ro"),
            Ok(ExportSpec {
                name: "disk".into(),
                path: "/vm/disk.img".into(),
                size: Some(2 << 30),
                read_only: true
            })
        );
        assert_eq!(
            parse("d=fs:/x").map(|s| (s.size, s.read_only)),
            Ok((None, false))
        );
        for (bad, says) in [
            ("disk", "expected NAME=fs:/PATH"),
            ("=fs:/x", "1 to 4096 bytes"),
            ("d=/x", "fs:/PATH"),
            ("d=fs:x", "absolute"),
            ("d=fs:/", "absolute"),
            ("d=fs:/x,size=1000", "multiple of 512"),
            ("d=fs:/x,size=lots", "lots"),
            ("d=fs:/x,fast", "unknown setting"),
        ] {
            let e = parse(bad).expect_err(bad);
            assert!(e.contains(says), "{bad}: {e}");
        }
    }
}
