//! Flag values with units, parsed once where clap reads them: sizes (`512m`, `1g`, `1GiB`; a
//! bare number keeps the flag's documented unit), durations (`90`, `5s`, `2m`, `1h30m`) and
//! signals (`KILL`, `SIGTERM`, `9`).

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// A size in bytes; `bare` is the unit of a number written without one.
fn bytes(s: &str, bare: u64) -> Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    if num.is_empty() {
        return Err(format!(
            "{s:?} is not a size; write a size such as 512m, 1g or 1GiB"
        ));
    }
    let unit_bytes = match unit.trim().to_ascii_lowercase().as_str() {
        "" => bare,
        "k" | "kb" | "kib" => KIB,
        "m" | "mb" | "mib" => MIB,
        "g" | "gb" | "gib" => GIB,
        "t" | "tb" | "tib" => GIB << 10,
        other => {
            return Err(format!(
                "{s:?}: unknown unit {other:?}; write a size such as 512m, 1g or 1GiB"
            ))
        }
    };
    let n: f64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a size; write a size such as 512m, 1g or 1GiB"))?;
    let b = n * unit_bytes as f64;
    if !(b.is_finite() && b >= 0.0 && b < u64::MAX as f64) {
        return Err(format!("{s:?} is out of range"));
    }
    Ok(b as u64)
}

/// A whole number of `unit` (a size named `unit_name`, e.g. "MiB"), within `range`, which
/// `what` ("guest memory must be from 128m to 64g") says in words.
fn whole(
    s: &str,
    unit: u64,
    unit_name: &str,
    range: std::ops::RangeInclusive<u64>,
    what: &str,
) -> Result<u32, String> {
    let b = bytes(s, unit)?;
    if b % unit != 0 {
        return Err(format!("{s:?} is not a whole number of {unit_name}"));
    }
    let n = b / unit;
    if !range.contains(&n) {
        return Err(format!("{s:?} is {n} {unit_name}; {what}"));
    }
    Ok(n as u32)
}

/// Guest memory in MiB: `1g`, `512m`, or a number of MiB; 128 MiB to 64 GiB.
pub fn memory_mib(s: &str) -> Result<u32, String> {
    whole(
        s,
        MIB,
        "MiB",
        128..=65536,
        "guest memory must be from 128m to 64g",
    )
}

/// A disk size in GiB: `20g`, `20GiB`, or a number of GiB; 1 to 4096 GiB.
pub fn disk_gib(s: &str) -> Result<u32, String> {
    whole(s, GIB, "GiB", 1..=4096, "a disk must be from 1g to 4096g")
}

/// A duration in whole seconds: `90`, `5s`, `2m`, `1h30m`, `1d`; at least a second.
pub fn seconds(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let secs = match t.parse::<u64>() {
        Ok(n) => n,
        Err(_) => {
            let d = humantime::parse_duration(t).map_err(|e| {
                format!("{s:?} is not a duration ({e}); write 90, 90s, 2m or 1h30m")
            })?;
            if d.subsec_nanos() != 0 {
                return Err(format!("{s:?}: durations here are whole seconds"));
            }
            d.as_secs()
        }
    };
    if secs == 0 {
        return Err(format!("{s:?}: a duration must be at least 1s"));
    }
    Ok(secs)
}

/// A duration in seconds of at most `max` seconds, which `said` names ("30 days").
fn seconds_at_most(s: &str, max: u64, said: &str) -> Result<u64, String> {
    match seconds(s)? {
        t if t > max => Err(format!("{s:?} is longer than {said}")),
        t => Ok(t),
    }
}

/// A TTL: a duration of at most 30 days.
pub fn ttl(s: &str) -> Result<u64, String> {
    seconds_at_most(s, forkbox_engine::api::MAX_TTL_SECS, "30 days")
}

/// An idle time before a sandbox sleeps: a duration of at most 7 days.
pub fn idle(s: &str) -> Result<u64, String> {
    seconds_at_most(s, forkbox_engine::api::MAX_IDLE_SECS, "7 days")
}

/// An idle time in seconds, or none (`off`: no sleeping).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdleAfter(pub Option<u64>);

/// An idle time, or `off` (no sleeping).
pub fn idle_or_off(s: &str) -> Result<IdleAfter, String> {
    match s.trim() {
        "off" | "never" | "0" => Ok(IdleAfter(None)),
        t => idle(t).map(|n| IdleAfter(Some(n))),
    }
}

/// A command's timeout: a duration of at most 24 h, as the API takes it.
pub fn timeout(s: &str) -> Result<u64, String> {
    seconds_at_most(s, forkbox_engine::api::MAX_TIMEOUT_SECS, "24 h")
}

/// A signal by name (`KILL`, `SIGKILL`, `kill`) or number (`9`).
pub fn signal(s: &str) -> Result<i32, String> {
    use std::str::FromStr;
    let t = s.trim();
    if let Ok(n) = t.parse::<i32>() {
        return nix::sys::signal::Signal::try_from(n)
            .map(|sig| sig as i32)
            .map_err(|_| format!("{s:?} is not a signal number on Linux"));
    }
    let upper = t.to_ascii_uppercase();
    let name = match upper.starts_with("SIG") {
        true => upper,
        false => format!("SIG{upper}"),
    };
    nix::sys::signal::Signal::from_str(&name)
        .map(|sig| sig as i32)
        .map_err(|_| format!("{s:?} is not a signal; write TERM, KILL, INT, HUP, … or a number"))
}

/// `NAME:/path` or `NAME:/path:ro`: a volume to mount.
pub fn volume_mount(s: &str) -> Result<forkbox_engine::api::VolumeMount, String> {
    s.parse().map_err(|e: forkbox_engine::api::Invalid| e.0)
}

/// A volume's size: 512m, 10g, 1t.
pub fn volume_size(s: &str) -> Result<String, String> {
    forkbox_engine::api::parse_size(s)
        .map(|_| s.to_string())
        .map_err(|e| e.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_take_units_and_bare_numbers_keep_the_flags_unit() {
        assert_eq!(memory_mib("1024"), Ok(1024));
        assert_eq!(memory_mib("1g"), Ok(1024));
        assert_eq!(memory_mib("1GiB"), Ok(1024));
        assert_eq!(memory_mib("1.5g"), Ok(1536));
        assert_eq!(memory_mib("512m"), Ok(512));
        assert_eq!(memory_mib("512MB"), Ok(512));
        assert!(memory_mib("10").unwrap_err().contains("from 128m to 64g"));
        assert!(memory_mib("1x").unwrap_err().contains("unknown unit"));
        assert!(memory_mib("abc").unwrap_err().contains("not a size"));
        assert!(memory_mib("1000k")
            .unwrap_err()
            .contains("whole number of MiB"));
        assert_eq!(disk_gib("20"), Ok(20));
        assert_eq!(disk_gib("20g"), Ok(20));
        assert_eq!(disk_gib("2048m"), Ok(2));
        assert!(disk_gib("0").is_err());
    }

    #[test]
    fn durations_take_units() {
        assert_eq!(seconds("90"), Ok(90));
        assert_eq!(seconds("5s"), Ok(5));
        assert_eq!(seconds("2m"), Ok(120));
        assert_eq!(seconds("1h30m"), Ok(5400));
        assert_eq!(seconds("1d"), Ok(86400));
        assert!(seconds("0").unwrap_err().contains("at least 1s"));
        assert!(seconds("1500ms").is_err());
        assert!(seconds("soon").unwrap_err().contains("not a duration"));
        assert_eq!(timeout("24h"), Ok(86400));
        assert!(timeout("25h").unwrap_err().contains("longer than 24 h"));
        assert!(ttl("31d").unwrap_err().contains("longer than 30 days"));
    }

    #[test]
    fn signals_by_name_or_number() {
        assert_eq!(signal("KILL"), Ok(9));
        assert_eq!(signal("sigterm"), Ok(15));
        assert_eq!(signal("SIGINT"), Ok(2));
        assert_eq!(signal("9"), Ok(9));
        assert!(signal("NOPE").is_err());
        assert!(signal("99").is_err());
    }
}
