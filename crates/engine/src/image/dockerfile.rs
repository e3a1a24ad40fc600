//! Reading a Dockerfile: the instructions forkbox builds (`FROM`, `RUN`, `COPY`, `ADD`, `ENV`,
//! `ARG`, `WORKDIR`, `USER`, `LABEL`; multi-stage with `COPY --from`), the ones it records and
//! says it does not use (`CMD`, `ENTRYPOINT`, `EXPOSE`: a sandbox runs the commands it is
//! given), and everything else refused by name and line, never skipped.

use std::collections::BTreeMap;

/// Why a Dockerfile cannot be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("Dockerfile line {line}: {message}")]
pub struct DockerfileError {
    pub line: usize,
    pub message: String,
}

fn err<T>(line: usize, message: impl Into<String>) -> Result<T, DockerfileError> {
    Err(DockerfileError {
        line,
        message: message.into(),
    })
}

/// What a `RUN` runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunForm {
    /// `RUN cmd`: `/bin/sh -c cmd`.
    Shell(String),
    /// `RUN ["prog", "arg"]`: executed directly.
    Exec(Vec<String>),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    Run {
        line: usize,
        run: RunForm,
    },
    /// `COPY`, or `ADD` (`add`: a local tar archive is unpacked, as docker does).
    Copy {
        line: usize,
        add: bool,
        from: Option<String>,
        chown: Option<String>,
        chmod: Option<String>,
        srcs: Vec<String>,
        dest: String,
    },
    Env {
        line: usize,
        vars: Vec<(String, String)>,
    },
    Arg {
        line: usize,
        name: String,
        default: Option<String>,
    },
    Workdir {
        line: usize,
        path: String,
    },
    User {
        line: usize,
        user: String,
    },
    Label {
        line: usize,
        pairs: Vec<(String, String)>,
    },
    /// Recorded and said, not used.
    Unused {
        line: usize,
        instruction: String,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stage {
    pub line: usize,
    /// As written (variables are substituted when it is built).
    pub from: String,
    pub name: Option<String>,
    pub steps: Vec<Step>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dockerfile {
    /// `ARG`s before the first `FROM` (usable in `FROM` lines).
    pub global_args: Vec<(String, Option<String>)>,
    pub stages: Vec<Stage>,
}

impl Dockerfile {
    /// The global `ARG`s' values: each the build argument given for it, else its default.
    pub fn globals(&self, args: &BTreeMap<String, String>) -> BTreeMap<String, String> {
        self.global_args
            .iter()
            .filter_map(|(k, d)| Some((k.clone(), args.get(k).or(d.as_ref())?.clone())))
            .collect()
    }
}

/// Logical lines: continuations joined, comments and blank lines dropped; each with the number
/// of the line it starts on.
fn logical_lines(text: &str) -> Result<Vec<(usize, String)>, DockerfileError> {
    let mut out = Vec::new();
    let mut current: Option<(usize, String)> = None;
    let mut directives = true;
    for (i, raw) in text.lines().enumerate() {
        let n = i + 1;
        let trimmed = raw.trim();
        if directives {
            if let Some(d) = trimmed.strip_prefix('#') {
                let d = d.trim().to_ascii_lowercase();
                if d.starts_with("escape=") && d.trim_start_matches("escape=").trim() != "\\" {
                    return err(
                        n,
                        "the `escape` parser directive is not supported (only `\\`)",
                    );
                }
                continue;
            }
            directives = false;
        }
        if trimmed.starts_with('#') || (trimmed.is_empty() && current.is_none()) {
            continue;
        }
        let (body, continues) = match trimmed.strip_suffix('\\') {
            Some(b) => (b, true),
            None => (trimmed, false),
        };
        match &mut current {
            Some((_, s)) => {
                s.push(' ');
                s.push_str(body.trim());
            }
            None => current = Some((n, body.trim().to_string())),
        }
        if !continues {
            if let Some(c) = current.take() {
                if !c.1.is_empty() {
                    out.push(c);
                }
            }
        }
    }
    if let Some(c) = current {
        if !c.1.is_empty() {
            out.push(c);
        }
    }
    Ok(out)
}

/// `--name=value` flags at the start of `rest`, and what follows them.
fn flags(rest: &str) -> (Vec<(String, String)>, String) {
    let mut out = Vec::new();
    let mut rest = rest.trim_start();
    while let Some(f) = rest.strip_prefix("--") {
        let end = f.find(char::is_whitespace).unwrap_or(f.len());
        let (flag, after) = f.split_at(end);
        let (k, v) = flag.split_once('=').unwrap_or((flag, ""));
        out.push((k.to_ascii_lowercase(), v.to_string()));
        rest = after.trim_start();
    }
    (out, rest.to_string())
}

/// A JSON array of strings (the exec form), if `rest` is one.
fn json_array(rest: &str) -> Option<Vec<String>> {
    let t = rest.trim();
    if !t.starts_with('[') {
        return None;
    }
    serde_json::from_str::<Vec<String>>(t).ok()
}

/// Splits on whitespace, keeping quoted parts ("a b" or 'a b') together, quotes removed.
fn words(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quote: Option<char> = None;
    let mut any = false;
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some('"'), '\\') => {
                if let Some(n) = chars.next() {
                    cur.push(n);
                }
            }
            (Some(_), c) => cur.push(c),
            (None, '"' | '\'') => {
                quote = Some(c);
                any = true;
            }
            (None, '\\') => {
                if let Some(n) = chars.next() {
                    cur.push(n);
                    any = true;
                }
            }
            (None, c) if c.is_whitespace() => {
                if any || !cur.is_empty() {
                    out.push(std::mem::take(&mut cur));
                    any = false;
                }
            }
            (None, c) => cur.push(c),
        }
    }
    if any || !cur.is_empty() {
        out.push(cur);
    }
    out
}

/// `k=v k2="v 2"` pairs, or the old `ENV k v` form.
fn pairs(line: usize, rest: &str, what: &str) -> Result<Vec<(String, String)>, DockerfileError> {
    let ws = words(rest);
    if ws.is_empty() {
        return err(line, format!("{what} needs at least one NAME=VALUE"));
    }
    if !ws[0].contains('=') {
        // ENV NAME VALUE...: the rest of the line is the value.
        let t = rest.trim();
        let (k, v) = t.split_once(char::is_whitespace).unwrap_or((t, ""));
        if what == "LABEL" || v.trim().is_empty() {
            return err(line, format!("{what} needs NAME=VALUE"));
        }
        return Ok(vec![(k.to_string(), v.trim().to_string())]);
    }
    ws.into_iter()
        .map(|w| match w.split_once('=') {
            Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
            _ => err(line, format!("{what}: {w:?} is not NAME=VALUE")),
        })
        .collect()
}

fn refuse_flags(line: usize, what: &str, fl: &[(String, String)]) -> Result<(), DockerfileError> {
    match fl.first() {
        Some((k, _)) => err(line, format!("{what} --{k} is not supported")),
        None => Ok(()),
    }
}

pub fn parse(text: &str) -> Result<Dockerfile, DockerfileError> {
    let mut df = Dockerfile {
        global_args: Vec::new(),
        stages: Vec::new(),
    };
    for (line, l) in logical_lines(text)? {
        let (word, rest) = l.split_once(char::is_whitespace).unwrap_or((&l, ""));
        let instr = word.to_ascii_uppercase();
        let rest = rest.trim();
        if instr == "FROM" {
            df.stages.push(from(line, rest)?);
            continue;
        }
        if instr == "ARG" && df.stages.is_empty() {
            let (name, default) = arg(line, rest)?;
            df.global_args.push((name, default));
            continue;
        }
        let Some(stage) = df.stages.last_mut() else {
            return err(line, format!("{instr} before the first FROM"));
        };
        stage.steps.push(step(line, &instr, rest)?);
    }
    if df.stages.is_empty() {
        return err(1, "no FROM: a Dockerfile starts from an image");
    }
    copies_name_earlier_stages(&df)?;
    Ok(df)
}

/// `FROM [--platform=linux/amd64] IMAGE [AS NAME]`: a new stage.
fn from(line: usize, rest: &str) -> Result<Stage, DockerfileError> {
    let (fl, rest) = flags(rest);
    for (k, v) in &fl {
        if k != "platform"
            || !matches!(
                v.as_str(),
                "linux/amd64" | "$BUILDPLATFORM" | "$TARGETPLATFORM"
            )
        {
            return err(
                line,
                format!("FROM --{k}={v} is not supported (forkbox builds linux/amd64)"),
            );
        }
    }
    let ws = words(&rest);
    let (from, name) = match ws.as_slice() {
        [f] => (f.clone(), None),
        [f, as_, n] if as_.eq_ignore_ascii_case("as") => (f.clone(), Some(n.to_ascii_lowercase())),
        _ => return err(line, "FROM takes IMAGE [AS NAME]"),
    };
    Ok(Stage {
        line,
        from,
        name,
        steps: Vec::new(),
    })
}

/// One instruction of a stage (`instr` in capitals, `rest` what follows it).
fn step(line: usize, instr: &str, rest: &str) -> Result<Step, DockerfileError> {
    Ok(match instr {
        "RUN" => run(line, rest)?,
        "COPY" | "ADD" => copy(line, instr, rest)?,
        "ENV" => Step::Env {
            line,
            vars: pairs(line, rest, "ENV")?,
        },
        "ARG" => {
            let (name, default) = arg(line, rest)?;
            Step::Arg { line, name, default }
        }
        "WORKDIR" if !rest.is_empty() => Step::Workdir {
            line,
            path: rest.to_string(),
        },
        "USER" if !rest.is_empty() => Step::User {
            line,
            user: rest.to_string(),
        },
        "LABEL" => Step::Label {
            line,
            pairs: pairs(line, rest, "LABEL")?,
        },
        "MAINTAINER" => Step::Label {
            line,
            pairs: vec![("maintainer".into(), rest.to_string())],
        },
        "CMD" | "ENTRYPOINT" | "EXPOSE" => Step::Unused {
            line,
            instruction: instr.to_string(),
        },
        "WORKDIR" | "USER" => return err(line, format!("{instr} needs a value")),
        other => {
            return err(
                line,
                format!(
                    "{other} is not supported (forkbox builds FROM, RUN, COPY, ADD, ENV, ARG, WORKDIR, USER and LABEL)"
                ),
            )
        }
    })
}

/// `RUN command` (a shell's) or `RUN ["program", "arg", ...]`.
fn run(line: usize, rest: &str) -> Result<Step, DockerfileError> {
    let (fl, rest) = flags(rest);
    refuse_flags(line, "RUN", &fl)?;
    if rest.contains("<<") && rest.trim_start().starts_with("<<") {
        return err(line, "RUN with a here-document is not supported");
    }
    let run = match json_array(&rest) {
        Some(argv) if argv.is_empty() => return err(line, "RUN [] runs nothing"),
        Some(argv) => RunForm::Exec(argv),
        None if rest.trim().is_empty() => return err(line, "RUN needs a command"),
        None => RunForm::Shell(rest.trim().to_string()),
    };
    Ok(Step::Run { line, run })
}

/// `COPY`/`ADD [--from=STAGE] [--chown=..] [--chmod=..] SOURCE... DEST` (`--from` for COPY
/// only; no URLs for ADD).
fn copy(line: usize, instr: &str, rest: &str) -> Result<Step, DockerfileError> {
    let add = instr == "ADD";
    let (fl, rest) = flags(rest);
    let (mut from, mut chown, mut chmod) = (None, None, None);
    for (k, v) in fl {
        match k.as_str() {
            "from" if !add => from = Some(v.to_ascii_lowercase()),
            "chown" => chown = Some(v),
            "chmod" => chmod = Some(v),
            _ => return err(line, format!("{instr} --{k} is not supported")),
        }
    }
    let mut parts = match json_array(&rest) {
        Some(a) => a,
        None => words(&rest),
    };
    if parts.len() < 2 {
        return err(line, format!("{instr} needs SOURCE... DEST"));
    }
    let dest = parts.pop().unwrap_or_default();
    if add {
        if let Some(url) = parts
            .iter()
            .find(|s| s.contains("://") || s.starts_with("git@"))
        {
            return err(
                line,
                format!("ADD from a URL ({url}) is not supported: download it in a RUN step"),
            );
        }
    }
    Ok(Step::Copy {
        line,
        add,
        from,
        chown,
        chmod,
        srcs: parts,
        dest,
    })
}

/// Every COPY --from names an earlier stage (by name or number).
fn copies_name_earlier_stages(df: &Dockerfile) -> Result<(), DockerfileError> {
    for (i, st) in df.stages.iter().enumerate() {
        for step in &st.steps {
            if let Step::Copy {
                line,
                from: Some(f),
                ..
            } = step
            {
                if stage_index(&df.stages[..i], f).is_none() {
                    return err(
                        *line,
                        format!("COPY --from={f} names no earlier stage (copying from an image is not supported: FROM it AS a stage first)"),
                    );
                }
            }
        }
    }
    Ok(())
}

/// The stage `name` (its `AS` name, or its number) among `stages`.
pub fn stage_index(stages: &[Stage], name: &str) -> Option<usize> {
    stages
        .iter()
        .position(|s| s.name.as_deref() == Some(name))
        .or_else(|| name.parse::<usize>().ok().filter(|i| *i < stages.len()))
}

fn arg(line: usize, rest: &str) -> Result<(String, Option<String>), DockerfileError> {
    let ws = words(rest);
    let [w] = ws.as_slice() else {
        return err(line, "ARG takes one NAME[=DEFAULT]");
    };
    let (n, d) = match w.split_once('=') {
        Some((n, d)) => (n.to_string(), Some(d.to_string())),
        None => (w.clone(), None),
    };
    if n.is_empty() || !n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return err(line, format!("ARG {n:?} is not a variable name"));
    }
    Ok((n, d))
}

/// Substitutes `$NAME`, `${NAME}`, `${NAME:-default}` and `${NAME:+alt}` from `vars`, as
/// docker does in `FROM`, `COPY`, `ENV`, `WORKDIR`, `USER` and `LABEL` (a `RUN` gets them in its
/// environment and its shell substitutes). `\$` is a literal `$`.
pub fn substitute(s: &str, vars: &BTreeMap<String, String>) -> String {
    let mut out = String::new();
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\\' && chars.peek() == Some(&'$') {
            out.push('$');
            chars.next();
            continue;
        }
        if c != '$' {
            out.push(c);
            continue;
        }
        if chars.peek() == Some(&'{') {
            chars.next();
            let mut inner = String::new();
            for c in chars.by_ref() {
                if c == '}' {
                    break;
                }
                inner.push(c);
            }
            let (name, op) = match inner.find(":-").or_else(|| inner.find(":+")) {
                Some(i) => (&inner[..i], Some((&inner[i..i + 2], &inner[i + 2..]))),
                None => (inner.as_str(), None),
            };
            let val = vars.get(name).filter(|v| !v.is_empty());
            match (op, val) {
                (Some((":-", d)), None) => out.push_str(&substitute(d, vars)),
                (Some((":+", a)), Some(_)) => out.push_str(&substitute(a, vars)),
                (Some((":+", _)), None) => {}
                (_, v) => out.push_str(v.map_or("", String::as_str)),
            }
            continue;
        }
        let mut name = String::new();
        while let Some(&c) = chars.peek() {
            if c.is_ascii_alphanumeric() || c == '_' {
                name.push(c);
                chars.next();
            } else {
                break;
            }
        }
        if name.is_empty() {
            out.push('$');
        } else {
            out.push_str(vars.get(&name).map_or("", String::as_str));
        }
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const MULTI: &str = r#"# syntax=docker/dockerfile:1
ARG NODE=18
FROM node:${NODE}-slim AS build
WORKDIR /src
COPY package*.json ./
RUN npm ci \
    # a comment inside a continuation
    && npm run build
ENV A=1 B="two words"
ENV OLD style value
COPY --chown=node:node . .

FROM debian:bookworm-slim
LABEL org.opencontainers.image.title="demo" version=2
COPY --from=build /src/dist /opt/app
USER 1000:1000
RUN ["/opt/app/bin", "--check"]
CMD ["node", "index.js"]
"#;

    #[test]
    fn a_multi_stage_dockerfile_reads_as_written() {
        let df = parse(MULTI).unwrap();
        assert_eq!(df.global_args, vec![("NODE".into(), Some("18".into()))]);
        assert_eq!(df.stages.len(), 2);
        let b = &df.stages[0];
        assert_eq!(
            (b.line, b.from.as_str(), b.name.as_deref()),
            (3, "node:${NODE}-slim", Some("build"))
        );
        assert_eq!(
            b.steps[2],
            Step::Run {
                line: 6,
                run: RunForm::Shell("npm ci && npm run build".into())
            }
        );
        assert_eq!(
            b.steps[3],
            Step::Env {
                line: 9,
                vars: vec![("A".into(), "1".into()), ("B".into(), "two words".into())]
            }
        );
        assert_eq!(
            b.steps[4],
            Step::Env {
                line: 10,
                vars: vec![("OLD".into(), "style value".into())]
            }
        );
        let f = &df.stages[1];
        assert!(matches!(&f.steps[1], Step::Copy { from: Some(s), .. } if s == "build"));
        assert!(matches!(&f.steps[3], Step::Run { run: RunForm::Exec(a), .. } if a.len() == 2));
        assert!(
            matches!(&f.steps[4], Step::Unused { instruction, line: 18 } if instruction == "CMD")
        );
        let mut vars = BTreeMap::new();
        vars.insert("NODE".to_string(), "18".to_string());
        assert_eq!(substitute(&b.from, &vars), "node:18-slim");
        assert_eq!(
            substitute("${MISSING:-dflt} ${NODE:+set} \\$HOME $NODE", &vars),
            "dflt set $HOME 18"
        );
    }

    #[test]
    fn what_forkbox_does_not_build_is_refused_by_name_and_line() {
        let cases = [
            (
                "FROM a\nHEALTHCHECK CMD true\n",
                2,
                "HEALTHCHECK is not supported",
            ),
            (
                "FROM a\nRUN --mount=type=cache,target=/x true\n",
                2,
                "RUN --mount",
            ),
            ("FROM a\nADD https://example.com/x /x\n", 2, "URL"),
            (
                "FROM a\nCOPY --from=nope /x /y\n",
                2,
                "names no earlier stage",
            ),
            ("FROM a\n\nSHELL [\"/bin/bash\", \"-c\"]\n", 3, "SHELL"),
            ("RUN true\n", 1, "before the first FROM"),
            ("# escape=`\nFROM a\n", 1, "escape"),
            ("", 1, "no FROM"),
            ("FROM --platform=linux/arm64 a\n", 1, "linux/amd64"),
            ("FROM a\nVOLUME /data\n", 2, "VOLUME"),
            ("FROM a\nONBUILD RUN x\n", 2, "ONBUILD"),
        ];
        for (text, line, what) in cases {
            let e = parse(text).unwrap_err();
            assert_eq!(e.line, line, "{text:?}: {e}");
            assert!(e.message.contains(what), "{text:?}: {e}");
        }
    }
}
