//! Requests turned into what the engine runs: each is parsed into its type once (in
//! `forkbox-api`) and checked here.

use forkbox_api::{BuildRequest, ExecRequest, ImageView, TerminalSize, MAX_TIMEOUT_SECS};
use forkbox_protocol::{ExecSpec, Program};

use super::EngineError;

/// Checks an exec request and turns it into the protocol's command.
pub fn exec_spec(r: ExecRequest) -> Result<ExecSpec, EngineError> {
    let program = match (r.argv, r.shell) {
        (Some(a), None) if !a.is_empty() => Program::Argv(a),
        (None, Some(s)) => Program::Shell(s),
        _ => {
            return Err(EngineError::BadRequest(
                "give exactly one of `argv` (non-empty) and `shell`".into(),
            ))
        }
    };
    let timeout_ms = match (r.timeout_secs, r.timeout_ms) {
        (Some(_), Some(_)) => {
            return Err(EngineError::BadRequest(
                "give `timeout_secs` or `timeout_ms`, not both".into(),
            ))
        }
        (Some(s), None) => Some(s.saturating_mul(1000)),
        (None, ms) => ms,
    };
    if let Some(t) = timeout_ms {
        if t == 0 || t > MAX_TIMEOUT_SECS * 1000 {
            return Err(EngineError::BadRequest(format!(
                "timeout {t} ms is not between 1 ms and {MAX_TIMEOUT_SECS} s (24 h)"
            )));
        }
    }
    Ok(ExecSpec {
        program,
        cwd: r.cwd,
        env: r.env.into_iter().collect(),
        timeout_ms,
        stdin: r.stdin,
        tty: r.tty.map(TerminalSize::checked).transpose()?,
        user: None,
    })
}

/// The recipe a build request describes, checked.
pub fn build_recipe(r: &BuildRequest) -> Result<crate::image::Recipe, EngineError> {
    crate::image::Recipe::from_seed(&r.name, r.recipe.clone())
        .map_err(|m| EngineError::BadRequest(format!("recipe for {:?}: {m}", r.name)))
}

impl From<&crate::image::Image> for ImageView {
    fn from(i: &crate::image::Image) -> ImageView {
        ImageView {
            reference: i.reference(),
            name: i.meta.name.clone(),
            version: i.meta.version,
            suite: i.meta.suite.clone(),
            base: i.meta.recipe.base.clone(),
            pulled: i.meta.pulled.clone(),
            workdir: i.meta.workdir.clone(),
            user: i.meta.user.clone(),
            kernel: i.meta.kernel.clone(),
            content_mib: i.meta.content_bytes >> 20,
            disk_mib: i.meta.disk_bytes >> 20,
            created_unix: i.meta.created_unix,
            build_seconds: i.meta.build_seconds,
            env: i.meta.env.clone(),
        }
    }
}

/// `value` when it lies in `range`, else a bad request naming `what` and the bounds.
pub(super) fn within<T>(
    what: &str,
    value: T,
    range: std::ops::RangeInclusive<T>,
) -> Result<T, EngineError>
where
    T: PartialOrd + std::fmt::Display + Copy,
{
    if range.contains(&value) {
        Ok(value)
    } else {
        Err(EngineError::BadRequest(format!(
            "{what} {value} is not between {} and {}",
            range.start(),
            range.end()
        )))
    }
}
