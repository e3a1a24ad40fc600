//! What the volume content API runs in the sandbox that has the volume mounted: one POSIX `sh`
//! script with the tools every Debian root has (coreutils, findutils), as root, every path
//! under the volume's mount point and kept there (a link that leads out of the volume is
//! refused, never followed).
//!
//! Exit codes: 2 no such path, 17 it exists, 20 a parent is not a directory, 21 it is a
//! directory, 22 the path leads out of the volume, 75 the volume is not mounted there.

/// One entry as `find -printf` writes it: type, size, mode bits (octal), uid, gid, atime,
/// ctime, mtime (seconds since the epoch), link target, path under the start, each ended by
/// NUL.
pub const ENTRY_FORMAT: &str = r"%y\0%s\0%m\0%U\0%G\0%A@\0%C@\0%T@\0%l\0%P\0";

/// Fields of one entry in [`ENTRY_FORMAT`].
pub const ENTRY_FIELDS: usize = 10;

/// `sh -c SCRIPT volume OP ROOT PATH [ARGS]`: PATH is the volume's (`/` its root), ROOT where
/// the volume is mounted.
const SCRIPT: &str = r#"op=$1; r=$2; p=$2$3; shift 3
[ "$p" = "$r/" ] && p=$r
if [ "$(stat -c %d -- "$r")" = "$(stat -c %d -- "$r/..")" ]; then
  echo "the volume is not mounted at $r" >&2; exit 75
fi
inside() { q=$(realpath -m -- "$1") || exit 22
  case $q in "$r"|"$r"/*) ;; *) echo "the path leads out of the volume" >&2; exit 22;; esac; }
parent=${p%/*}; [ -n "$parent" ] || parent=/
[ "$p" = "$r" ] || inside "$parent"
show() { cd -- "${1%/*}/" && find "./${1##*/}" -maxdepth 0 -printf "$F"; }
[ "$p" = "$r" ] && show() { cd -- "$r" && find . -maxdepth 0 -printf "$F"; }
own() { [ -z "$1" ] || chown -h -- "$1" "$p" || exit 1
  [ -z "$2" ] || chgrp -h -- "$2" "$p" || exit 1
  [ -z "$3" ] || [ -L "$p" ] || chmod -- "$3" "$p" || exit 1; }
# What a call changed is on the volume's disk before it answers: a helper may be stopped
# (a sandbox asks for the volume) without a chance to write back its cache.
flush() { sync -f -- "$r"; }
case $op in
stat) [ -e "$p" ] || [ -L "$p" ] || exit 2; show "$p";;
list) [ -e "$p" ] || exit 2; inside "$p"; [ -d "$p" ] || exit 20
  cd -- "$p/" && find . -mindepth 1 -maxdepth "$1" -printf "$F";;
read) [ -e "$p" ] || exit 2; inside "$p"; [ -d "$p" ] && exit 21; [ -f "$p" ] || exit 2;;
write) [ -d "$p" ] && exit 21; [ -e "$parent" ] || exit 2; [ -d "$parent" ] || exit 20
  if [ -e "$p" ] || [ -L "$p" ]; then [ "$1" = true ] || exit 17; inside "$p"; fi;;
written) own "$1" "$2" "${3:-644}"; flush; show "$p";;
mkdir) if [ -e "$p" ]; then [ "$1" = true ] && [ -d "$p" ] && { show "$p"; exit 0; }; exit 17; fi
  if [ ! -d "$parent" ]; then
    [ "$1" = true ] || exit 2; [ -e "$parent" ] && exit 20
    mkdir -p -- "$parent" || exit 20; inside "$parent"
  fi
  mkdir -- "$p" || exit 1; own "$2" "$3" "${4:-755}"; flush; show "$p";;
patch) [ -e "$p" ] || [ -L "$p" ] || exit 2; own "$1" "$2" "$3"; flush; show "$p";;
remove) [ "$p" = "$r" ] && exit 2; [ -e "$p" ] || [ -L "$p" ] || exit 2; rm -rf -- "$p"; flush;;
*) exit 64;;
esac
"#;

/// The argv that runs `op` on `path` of the volume mounted at `root`, with `args`.
pub fn argv(op: &str, root: &str, path: &str, args: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = vec![
        "/bin/sh".into(),
        "-c".into(),
        format!("F='{ENTRY_FORMAT}'\n{SCRIPT}"),
        "volume".into(),
        op.into(),
        root.into(),
        path.into(),
    ];
    v.extend(args.iter().map(|a| a.to_string()));
    v
}
