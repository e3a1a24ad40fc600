#!/usr/bin/env bash
# Builds forkbox and installs it under PREFIX (default /usr/local): the CLI as
# PREFIX/bin/forkbox, its guest agent as PREFIX/lib/forkbox/forkbox-agent (where forkbox looks
# beside its own binary), man pages in PREFIX/share/man/man1 and bash completion. Copies, not
# links: the installed forkbox keeps working when the build tree changes or goes.
# Prints the installed CLI's path.
set -euo pipefail
cd "$(dirname "$0")/.."
prefix="${PREFIX:-/usr/local}"
cli=$(scripts/build.sh)
agent="$PWD/target/x86_64-unknown-linux-gnu/agent/forkbox-agent"
install -D -m 0755 "$agent" "$prefix/lib/forkbox/forkbox-agent.new"
mv -f "$prefix/lib/forkbox/forkbox-agent.new" "$prefix/lib/forkbox/forkbox-agent"
# A link left by an older install would make `install` write through it into the build tree.
rm -f "$prefix/bin/forkbox"
install -D -m 0755 "$cli" "$prefix/bin/forkbox"
"$prefix/bin/forkbox" man --dir "$prefix/share/man/man1"
install -d "$prefix/share/bash-completion/completions"
"$prefix/bin/forkbox" completions bash > "$prefix/share/bash-completion/completions/forkbox"
echo "$prefix/bin/forkbox"
