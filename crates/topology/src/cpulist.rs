//! The kernel's list format for CPU and node sets: `0-3,8,10-11`, or empty for none.
//!
//! Used by `nodeN/cpulist`, `node/online`, and our own output, so it lives in one place.

/// Largest id accepted in a list. Linux's NR_CPUS tops out at 8192 and MAX_NUMNODES at 1024;
/// a bound keeps a corrupt `0-4294967295` from allocating gigabytes.
pub const MAX_LIST_ID: u32 = 65_535;

/// Parses a kernel list such as `0-3,8` into a sorted, duplicate-free vector.
///
/// Returns a description of the problem on malformed input; callers attach the file name.
pub fn parse(text: &str) -> Result<Vec<u32>, String> {
    let text = text.trim();
    let mut ids = Vec::new();
    if text.is_empty() {
        return Ok(ids);
    }
    for part in text.split(',') {
        let part = part.trim();
        let (first, last) = match part.split_once('-') {
            Some((a, b)) => (parse_id(a, part)?, parse_id(b, part)?),
            None => {
                let id = parse_id(part, part)?;
                (id, id)
            }
        };
        if first > last {
            return Err(format!("range `{part}` runs backwards"));
        }
        ids.extend(first..=last);
    }
    ids.sort_unstable();
    let before = ids.len();
    ids.dedup();
    if ids.len() != before {
        return Err(format!("list `{text}` names an id twice"));
    }
    Ok(ids)
}

fn parse_id(text: &str, part: &str) -> Result<u32, String> {
    let id: u32 = text
        .trim()
        .parse()
        .map_err(|_| format!("`{part}` is not a number or a range of numbers"))?;
    if id > MAX_LIST_ID {
        return Err(format!(
            "id {id} in `{part}` exceeds the limit of {MAX_LIST_ID}"
        ));
    }
    Ok(id)
}

/// Formats ids in the kernel's compact form, collapsing runs: `[0,1,2,5]` → `0-2,5`.
pub fn format(ids: &[u32]) -> String {
    let mut sorted = ids.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let mut out = String::new();
    let mut i = 0;
    while i < sorted.len() {
        let start = sorted[i];
        let mut end = start;
        while i + 1 < sorted.len() && sorted[i + 1] == end + 1 {
            i += 1;
            end = sorted[i];
        }
        if !out.is_empty() {
            out.push(',');
        }
        if start == end {
            out.push_str(&start.to_string());
        } else {
            out.push_str(&format!("{start}-{end}"));
        }
        i += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_ranges_singles_and_empty() {
        assert_eq!(parse("0-3,8,10-11\n").unwrap(), vec![0, 1, 2, 3, 8, 10, 11]);
        assert_eq!(parse("5").unwrap(), vec![5]);
        assert_eq!(parse("\n").unwrap(), Vec::<u32>::new());
        assert_eq!(parse("3,1").unwrap(), vec![1, 3]);
    }

    #[test]
    fn rejects_garbage_with_a_reason() {
        assert!(parse("0-").unwrap_err().contains("not a number"));
        assert!(parse("a").unwrap_err().contains("not a number"));
        assert!(parse("3-1").unwrap_err().contains("backwards"));
        assert!(parse("1,1").unwrap_err().contains("twice"));
        assert!(parse("0-99999999").unwrap_err().contains("limit"));
        assert!(parse("1,,2").is_err());
    }

    #[test]
    fn format_round_trips() {
        for text in ["0-3,8,10-11", "0", "0,2,4", "1-2", ""] {
            assert_eq!(format(&parse(text).unwrap()), text);
        }
    }
}
