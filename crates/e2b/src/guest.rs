//! What the front end runs in a guest, as argv for the daemon's exec: envd's process table and
//! file calls in POSIX `sh` and the tools every Debian root has (util-linux's `setpriv`,
//! findutils' `find`, coreutils), so any forkbox image is a template.
//!
//! The guest holds the truth about its processes: each command the front end starts records
//! its pid's config and start time in `/run/e2b-proc.PID.*`, so a forked copy or a resumed sandbox
//! lists what runs in it, with no table on the host to keep in step.

/// The line a started command writes first, on its stdout, before it becomes the command:
/// `\x1ee2b-pid PID\n`. The front end takes it off the output.
pub const PID_MARK: &[u8] = b"\x1ee2b-pid ";

/// The sandbox's environment variables (create's `envVars`), sourced by every command.
pub const ENV_FILE: &str = "/etc/e2b/env";

/// Finds user `$1` (`""`: the default one: `user`, else root) in /etc/passwd and its home, in
/// `$u` and `$h`, `$d` being `$2` (`""`: that home); the two taken off the arguments. With the
/// shell's own `read`: a command's start runs no other program before it (each costs
/// milliseconds under TCG).
const LOOKUP: &str = r#"u=$1; d=$2; shift 2; h=; dh=; rh=/root
while IFS=: read -r n _ _ _ _ hh _; do
  case $n in user) dh=$hh;; root) rh=$hh;; esac
  [ -n "$u" ] && [ "$n" = "$u" ] && h=$hh
done < /etc/passwd
if [ -z "$u" ]; then if [ -n "$dh" ]; then u=user; h=$dh; else u=root; h=$rh; fi; fi
if [ -z "$h" ]; then echo "no user $u in this sandbox" >&2; exit 126; fi
[ -n "$d" ] || d=$h
case $d in /*) ;; *) d=$h/$d;; esac
"#;

/// Becomes `$1`'s user (see [`LOOKUP`]) with HOME, USER and LOGNAME set, in `$2` (a relative
/// one is the home's; a missing one made by the user, or by root where the user may not),
/// runs the rest.
const AS_USER: &str = r#"if [ ! -d "$d" ] && [ "$u" != root ]; then
  setpriv --reuid="$u" --regid="$u" --init-groups -- mkdir -p -- "$d" 2>/dev/null
fi
[ -d "$d" ] || mkdir -p -- "$d" 2>/dev/null
cd -- "$d" || exit 1
export HOME="$h" USER="$u" LOGNAME="$u"
[ -r /etc/e2b/env ] && . /etc/e2b/env
if [ "$u" = root ]; then exec "$@"; fi
exec setpriv --reuid="$u" --regid="$u" --init-groups -- "$@"
"#;

/// As [`AS_USER`] (`$1`'s home, HOME), but the rest runs as root, with the user in
/// `$E2B_USER`: envd's file calls act with its privileges and give what they make to the user.
const IN_HOME: &str = r#"cd -- "$d" 2>/dev/null || cd /
export HOME="$h" E2B_USER="$u"
exec "$@"
"#;

/// A process's start time (`/proc/PID/stat`'s 22nd field), which tells a live pid from a
/// reused one.
const START_TIME: &str = r#"st() { read -r s < /proc/$1/stat 2>/dev/null || return 1; s=${s##*) }; set -- $s; echo "${20}"; }
"#;

/// Records this shell's pid (config in `$E2B_PROC`), says it, then runs as `AS_USER` does.
fn start_script() -> String {
    format!(
        r#"{START_TIME}printf '%s' "$E2B_PROC" > /run/e2b-proc.$$.json; st $$ > /run/e2b-proc.$$.start
unset E2B_PROC
printf '\036e2b-pid %s\n' $$
{LOOKUP}{AS_USER}"#
    )
}

/// argv that runs `cmd` as `user` in `cwd` (`""`: the default user, its home), unrecorded: a
/// template build's ready command.
pub fn run(user: &str, cwd: &str, cmd: &[String]) -> Vec<String> {
    let mut v = vec![
        "/bin/sh".to_string(),
        "-c".to_string(),
        format!("{LOOKUP}{AS_USER}"),
        "e2b-run".to_string(),
        user.to_string(),
        cwd.to_string(),
    ];
    v.extend(cmd.iter().cloned());
    v
}

/// argv that runs `cmd` (envd's `cmd` and `args`) as `user` in `cwd`, recording it.
pub fn start(user: &str, cwd: &str, cmd: &[String]) -> Vec<String> {
    let mut v = vec![
        "/bin/sh".to_string(),
        "-c".to_string(),
        start_script(),
        "e2b-process".to_string(),
        user.to_string(),
        cwd.to_string(),
    ];
    v.extend(cmd.iter().cloned());
    v
}

/// argv that runs shell `script` with `args` as `$1…` as root in `user`'s home (the user in
/// `$E2B_USER`).
pub fn in_home(user: &str, script: &str, args: &[&str]) -> Vec<String> {
    wrapped(IN_HOME, user, script, args)
}

/// argv that finds `user` ([`LOOKUP`]), then runs `script` with `args` after `then`.
fn wrapped(then: &str, user: &str, script: &str, args: &[&str]) -> Vec<String> {
    let mut v = vec![
        "/bin/sh".to_string(),
        "-c".to_string(),
        format!("{LOOKUP}{then}"),
        "e2b".to_string(),
        user.to_string(),
        String::new(),
        "/bin/sh".to_string(),
        "-c".to_string(),
        script.to_string(),
        "e2b".to_string(),
    ];
    v.extend(args.iter().map(|a| a.to_string()));
    v
}

/// Lists the live recorded processes, `PID\tCONFIG-JSON` a line; clears the dead ones' records.
pub fn list_processes() -> Vec<String> {
    let script = format!(
        r#"{START_TIME}for f in /run/e2b-proc.*.json; do
  [ -e "$f" ] || continue
  p=${{f#/run/e2b-proc.}}; p=${{p%.json}}
  if [ "$(st $p)" = "$(cat /run/e2b-proc.$p.start 2>/dev/null)" ]; then
    printf '%s\t' "$p"; cat "$f"; echo
  else rm -f "$f" /run/e2b-proc.$p.start; fi
done"#
    );
    vec!["/bin/sh".into(), "-c".into(), script]
}

/// Sends signal `sig` (a number) to recorded process `pid`, exit 3 when no such one lives.
pub fn signal(pid: u32, sig: i32) -> Vec<String> {
    let script = format!(
        r#"{START_TIME}p={pid}
[ -e /run/e2b-proc.$p.json ] && [ "$(st $p)" = "$(cat /run/e2b-proc.$p.start 2>/dev/null)" ] || exit 3
kill -{sig} $p"#
    );
    vec!["/bin/sh".into(), "-c".into(), script]
}

/// Whether recorded process `pid` still lives (exit 0) or not (exit 3).
pub fn alive(pid: u32) -> Vec<String> {
    let script = format!(
        r#"{START_TIME}p={pid}
[ -e /run/e2b-proc.$p.json ] && [ "$(st $p)" = "$(cat /run/e2b-proc.$p.start 2>/dev/null)" ] || exit 3"#
    );
    vec!["/bin/sh".into(), "-c".into(), script]
}

/// `find -printf` format of one entry: its type, its target's type (for a symlink), size,
/// permission bits (octal), permissions as `ls` writes them, owner, group, mtime (seconds),
/// symlink target, path; NUL after each.
pub const ENTRY_FORMAT: &str = r"%y\t%Y\t%s\t%m\t%M\t%u\t%g\t%T@\t%l\t%p\0";

/// Sets `$p` to `$1` made absolute (a relative path is the user's home's, where the script
/// starts). Exit codes of the file scripts: 2 no such file, 17 exists, 20 not a directory.
const ABS: &str = r#"p=$1; case $p in /*) ;; *) p=$PWD/$p;; esac
[ "$p" = / ] || p=${p%/}
"#;

/// The agent's binary as a root process of the guest runs it: its file metadata helper.
pub const XATTRS_HELPER: &str = "/proc/1/exe";

/// What separates the entries a file script prints from their metadata.
pub const META_MARK: &str = "\x1exattrs\0";

/// `meta FIND-ARGS…`: [`META_MARK`], then the metadata (`user.e2b.*` attributes) of the paths
/// `find FIND-ARGS… -print0` names, from the agent's helper (PID 1's binary, run as root: the
/// file scripts run as root; `$FORKBOX_XATTRS` instead when set, as the host's tests of the
/// scripts set it); nothing more where the helper is not there.
const META: &str = r#"meta() { printf '\036xattrs\000'; find "$@" -print0 | ${FORKBOX_XATTRS:-/proc/1/exe} xattrs get 2>/dev/null; true; }
"#;

/// `$1`'s entry.
pub fn stat_script() -> String {
    format!(
        r#"{ABS}{META}[ -e "$p" ] || [ -L "$p" ] || {{ echo "$p: No such file or directory" >&2; exit 2; }}
find "$p" -maxdepth 0 -printf '{ENTRY_FORMAT}' && meta "$p" -maxdepth 0"#
    )
}

/// The entries under `$1` down to depth `$2`.
pub fn list_script() -> String {
    format!(
        r#"{ABS}{META}[ -e "$p" ] || {{ echo "$p: No such file or directory" >&2; exit 2; }}
[ -d "$p" ] || {{ echo "$p: Not a directory" >&2; exit 20; }}
find "$p" -mindepth 1 -maxdepth "$2" -printf '{ENTRY_FORMAT}' && meta "$p" -mindepth 1 -maxdepth "$2""#
    )
}

/// Makes directory `$1` with its parents, giving the ones it made to `$E2B_USER` (exit 17
/// when it exists), then its entry.
pub fn make_dir_script() -> String {
    format!(
        r#"{ABS}[ -e "$p" ] && {{ echo "$p: File exists" >&2; exit 17; }}
{MAKE_DIRS}mkdir -p -- "$p" && find "$p" -maxdepth 0 -printf '{ENTRY_FORMAT}'"#
    )
}

/// Makes `$p` with its parents, the ones made given to `$E2B_USER` (when set and not root).
const MAKE_DIRS: &str = r#"top=; x=$p
while [ ! -e "$x" ]; do top=$x; x=$(dirname -- "$x"); done
mkdir -p -- "$p" || exit 1
if [ -n "$top" ] && [ -n "$E2B_USER" ] && [ "$E2B_USER" != root ]; then chown -R "$E2B_USER:$(id -gn "$E2B_USER")" -- "$top"; fi
"#;

/// Renames `$1` to `$2` (its parent made), then its entry.
pub fn move_script() -> String {
    format!(
        r#"{ABS}{META}s=$p; set -- "$2"
{ABS}[ -e "$s" ] || [ -L "$s" ] || {{ echo "$s: No such file or directory" >&2; exit 2; }}
t=$p; p=$(dirname -- "$t")
{MAKE_DIRS}p=$t
mv -T -- "$s" "$p" && find "$p" -maxdepth 0 -printf '{ENTRY_FORMAT}' && meta "$p" -maxdepth 0"#
    )
}

/// Removes `$1` and everything under it.
pub fn remove_script() -> String {
    // A missing path is removed already (envd's `os.RemoveAll`).
    format!(r#"{ABS}rm -rf -- "$p""#)
}

/// Where the agent's binary is copied for every user to run as the watch helper.
const WATCH_HELPER: &str = "/run/forkbox-helper";

/// Run as root before a watch becomes its user: copies PID 1's binary to [`WATCH_HELPER`]
/// once, if it is an agent that has the helper (an older one, in a snapshot made before it,
/// has not: the watch then compares listings).
/// (`$wh` is [`WATCH_HELPER`], `$px` PID 1's binary, [`XATTRS_HELPER`]; `$h` is the user's
/// home, [`LOOKUP`]'s.)
const COPY_HELPER: &str = r#"if [ ! -x $wh ] && grep -qF 'watch DIR RECURSIVE(0|1) ENTRY(0|1)' $px 2>/dev/null; then
  cp $px $wh.$$ && chmod 755 $wh.$$ && mv -f $wh.$$ $wh || rm -f $wh.$$
fi
"#;

/// argv of a watch of `path` as `user` ([`watch_script`] with `recursive` and `entry`, `0` or
/// `1`), the helper made ready first.
pub fn watch(user: &str, path: &str, recursive: &str, entry: &str) -> Vec<String> {
    wrapped(
        &format!("wh={WATCH_HELPER} px={XATTRS_HELPER}\n{COPY_HELPER}{AS_USER}"),
        user,
        &watch_script(),
        &[path, recursive, entry],
    )
}

/// Watches directory `$1` (recursively when `$2` is 1; with entries when `$3` is 1) by the
/// agent's inotify helper where the guest has it ([`COPY_HELPER`]), else by comparing
/// listings every 200 ms (any image has `find` and `awk`): says `ready` once it has the
/// first, then a line `TYPE\tNAME` per change (NAME relative to the directory): CREATE and,
/// for a new file with data, WRITE; WRITE when size or time changes; CHMOD; REMOVE; RENAME for
/// the old name of an inode seen under a new one (which is a CREATE).
pub fn watch_script() -> String {
    format!(
        r#"{ABS}[ -e "$p" ] || {{ echo "$p: No such file or directory" >&2; exit 2; }}
[ -d "$p" ] || {{ echo "$p: Not a directory" >&2; exit 20; }}
[ -x {WATCH_HELPER} ] && exec {WATCH_HELPER} watch "$p" "$2" "${{3:-0}}"
depth="-maxdepth 1"; [ "$2" = 1 ] && depth=""
d=$(mktemp -d /tmp/.e2b-watch.XXXXXX) || exit 1
trap 'rm -rf "$d"' EXIT; trap 'exit 0' TERM INT HUP
snap() {{ find "$p" -mindepth 1 $depth -printf '%i\t%T@\t%s\t%m\t%y\t%P\n' 2>/dev/null > "$d/$1"; }}
snap a; echo ready
while sleep 0.2; do
  snap b
  awk -F'\t' '
    FILENAME == ARGV[1] {{ o[$6] = $1 FS $2 FS $3 FS $4; oi[$6] = $1; ot[$6] = $5; next }}
    {{ n[$6] = $1 FS $2 FS $3 FS $4; ni[$6] = $1; ns[$6] = $3; nt[$6] = $5; nm[$6] = $2 FS $3; np[$6] = $4 }}
    END {{
      for (k in oi) byino[oi[k]] = k
      for (k in n) {{
        if (!(k in o)) {{
          q = byino[ni[k]]
          if (q != "" && !(q in n) && !(q in gone)) {{ print "RENAME\t" q; gone[q] = 1; print "CREATE\t" k; continue }}
          print "CREATE\t" k
          if (nt[k] == "f" && ns[k] > 0) print "WRITE\t" k
          continue
        }}
        split(o[k], f, FS)
        if (f[2] FS f[3] != nm[k] && nt[k] != "d") print "WRITE\t" k
        if (f[4] != np[k]) print "CHMOD\t" k
      }}
      for (k in o) if (!(k in n) && !(k in gone)) print "REMOVE\t" k
    }}' "$d/a" "$d/b"
  mv "$d/b" "$d/a"
done"#
    )
}

/// Writes the sandbox's environment (lines made by [`env_file`]) to [`ENV_FILE`] from stdin.
pub fn write_env(text: &str) -> Vec<String> {
    let script = format!(
        "mkdir -p /etc/e2b && cat > {ENV_FILE}.new <<'E2B_ENV_END'\n{text}E2B_ENV_END\nchmod 0644 {ENV_FILE}.new && mv {ENV_FILE}.new {ENV_FILE}"
    );
    vec!["/bin/sh".into(), "-c".into(), script]
}

/// The text of [`ENV_FILE`] for `envs`: each set unless the command's own environment has it.
pub fn env_file(envs: &std::collections::BTreeMap<String, String>) -> Result<String, String> {
    let mut out = String::new();
    for (k, v) in envs {
        let name_ok = !k.is_empty()
            && !k.starts_with(|c: char| c.is_ascii_digit())
            && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !name_ok {
            return Err(format!(
                "envVars: {k:?} is not a variable name (letters, digits, _; not starting with a digit)"
            ));
        }
        if v.contains("E2B_ENV_END") {
            return Err(format!("envVars: the value of {k} holds E2B_ENV_END"));
        }
        out.push_str(&format!(
            "[ -n \"${{{k}+x}}\" ] || export {k}={}\n",
            quote(v)
        ));
    }
    Ok(out)
}

/// `s` in single quotes for `sh`.
pub fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// Run before a write of files `$2…` for user `$1` (as root, as envd writes): makes their
/// directories, giving the ones it made to the user, and says `new` or `old` for each file.
pub const PREPARE_WRITE_SCRIPT: &str = r#"u=$1; shift
g=$(id -gn "$u") || exit 1
for p; do
  d=$(dirname -- "$p"); top=; x=$d
  while [ ! -e "$x" ]; do top=$x; x=$(dirname -- "$x"); done
  mkdir -p -- "$d" || exit 1
  if [ -n "$top" ] && [ "$u" != root ]; then chown -R "$u:$g" -- "$top"; fi
  if [ -e "$p" ]; then echo old; else echo new; fi
done"#;

/// Gives files `$2…` to user `$1` (and its group).
pub const CHOWN_SCRIPT: &str = r#"u=$1; shift
g=$(id -gn "$u") || exit 1
chown "$u:$g" -- "$@""#;

/// argv that prints `USER:HOME` of user `user` (`""`: the default user, `user` or root).
pub fn home(user: &str) -> Vec<String> {
    let script = format!("{LOOKUP}echo \"$u:$h\"");
    vec![
        "/bin/sh".into(),
        "-c".into(),
        script,
        "e2b".into(),
        user.into(),
        String::new(),
    ]
}

/// The guest's use of CPU, memory and disk, measured over 200 ms: `cpus busy% memUsed
/// memTotal memCache diskUsed diskTotal` (bytes).
pub const METRICS_SCRIPT: &str = r#"read -r _ a b c d e f g _ < /proc/stat; t1=$((a+b+c+d+e+f+g)); i1=$((d+e))
sleep 0.2
read -r _ a b c d e f g _ < /proc/stat; t2=$((a+b+c+d+e+f+g)); i2=$((d+e))
dt=$((t2-t1)); [ $dt -gt 0 ] || dt=1
busy=$(( (100*(dt-(i2-i1)))/dt ))
mt=$(awk '/^MemTotal:/{print $2*1024}' /proc/meminfo); ma=$(awk '/^MemAvailable:/{print $2*1024}' /proc/meminfo)
mc=$(awk '/^Cached:/{print $2*1024}' /proc/meminfo)
set -- $(df -B1 --output=used,size / | tail -1)
echo "$(nproc) $busy $((mt-ma)) $mt $mc $1 $2""#;

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// The scripts run under this host's `sh` as they will in a guest (as root or not, no
    /// user switch): a process records itself, lists, and is signalled.
    #[test]
    fn the_process_table_lives_in_the_guest() {
        let sh = |argv: Vec<String>| {
            std::process::Command::new(&argv[0])
                .args(&argv[1..])
                .output()
                .unwrap()
        };
        let out = sh(vec![
            "/bin/sh".into(),
            "-c".into(),
            format!("{START_TIME}st $$"),
        ]);
        assert!(out.status.success());
        let n: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
        assert!(n > 0);
        let envs = [("A".to_string(), "it's".to_string())]
            .into_iter()
            .collect();
        let text = env_file(&envs).unwrap();
        let out = sh(vec![
            "/bin/sh".into(),
            "-c".into(),
            format!(
                "{text}echo \"$A\"; B=kept; {}",
                env_file(
                    &[("B".to_string(), "lost".to_string())]
                        .into_iter()
                        .collect()
                )
                .unwrap()
            ),
        ]);
        assert_eq!(String::from_utf8_lossy(&out.stdout), "it's\n");
        assert!(env_file(&[("1A".to_string(), String::new())].into_iter().collect()).is_err());
        assert_eq!(quote("a'b"), r"'a'\''b'");
        // Users are found in /etc/passwd by the shell alone (this host's root; the default
        // user is `user` where there is one, else root; an unknown one exits 126).
        let out = sh(home("root"));
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "root:/root");
        let out = sh(home(""));
        let has_user = std::fs::read_to_string("/etc/passwd")
            .unwrap()
            .lines()
            .any(|l| l.starts_with("user:"));
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).starts_with("user:"),
            has_user
        );
        assert_eq!(sh(home("no-such-user-here")).status.code(), Some(126));
    }

    /// A command's relative working directory is the user's home's (made when missing), as
    /// envd's; an absolute one is itself. (Run as this host's root, whose home is /root.)
    #[test]
    fn a_relative_cwd_is_the_homes() {
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        if !status.lines().any(|l| l.starts_with("Uid:\t0\t")) {
            return;
        }
        let rel = format!("forkbox-cwd-test-{}", std::process::id());
        let run = |cwd: &str| {
            let mut argv = vec!["/bin/sh".to_string(), "-c".to_string()];
            argv.push(format!("{LOOKUP}{AS_USER}"));
            argv.extend(["e2b", "root", cwd, "pwd"].map(String::from));
            let out = std::process::Command::new(&argv[0])
                .args(&argv[1..])
                .current_dir("/tmp")
                .output()
                .unwrap();
            String::from_utf8_lossy(&out.stdout).trim().to_string()
        };
        assert_eq!(run(&rel), format!("/root/{rel}"));
        assert_eq!(run("/tmp"), "/tmp");
        std::fs::remove_dir(format!("/root/{rel}")).unwrap();
    }

    /// A watch's set-up (the helper's copy, as root) leaves the user's HOME as it is.
    #[test]
    fn a_watch_runs_with_its_users_home() {
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        if !status.lines().any(|l| l.starts_with("Uid:\t0\t")) {
            return;
        }
        let mut argv = watch("root", "/tmp", "0", "0");
        argv[8] = r#"printf %s "$HOME""#.into();
        let out = std::process::Command::new(&argv[0])
            .args(&argv[1..])
            .output()
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout), "/root");
    }
}
