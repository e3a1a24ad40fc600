//! `forkbox image build|ls|rm|login|logout`: images built from a recipe, a registry image or
//! a Dockerfile, here or through the daemon, and the registry logins builds use.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Subcommand;
use forkbox_engine::api::ImageView;
use forkbox_engine::image::{self, oci, ImageRef, ImageStore, Recipe};
use forkbox_engine::paths::Paths;

use crate::{bundled, local, print_json, serve, terminal};

#[derive(Subcommand)]
pub enum ImageCmd {
    /// Build an image from a TOML recipe or a Dockerfile, as the next version of its name.
    ///
    /// A Dockerfile's instructions run in sandboxes (never on this host), stage by stage;
    /// `COPY` takes files from CONTEXT (the Dockerfile's directory unless given).
    Build {
        /// The recipe (`*.toml`) or Dockerfile (any other name).
        #[arg(short = 'f', long = "file")]
        file: PathBuf,
        /// The image's name (a Dockerfile's default: its context directory's name).
        #[arg(long)]
        name: Option<String>,
        /// A Dockerfile `ARG` value, NAME=VALUE (repeatable).
        #[arg(long = "build-arg", value_name = "NAME=VALUE")]
        build_args: Vec<String>,
        /// A Dockerfile's build context.
        context: Option<PathBuf>,
        /// Build only if the newest version of this name was built from a different recipe (a
        /// Dockerfile: other text, build arguments, context files or forkbox images it is
        /// built on).
        #[arg(long)]
        if_changed: bool,
        /// Print the result as JSON.
        #[arg(long)]
        json: bool,
    },
    /// List images, then the builds under way in this home (a daemon's too) with their step
    /// and time so far.
    Ls {
        /// Print the images as JSON (the builds under way: `GET /v1/builds`).
        #[arg(long)]
        json: bool,
    },
    /// Record credentials for a registry (sent to it alone), or that it speaks plain HTTP.
    ///
    /// Builds on a registry's image (a recipe's `base = "HOST/PATH:TAG"`) use them. Without
    /// this, forkbox reads `REGISTRY_AUTH_FILE` and `~/.docker/config.json`.
    Login {
        /// The registry: HOST or HOST:PORT (Docker Hub: docker.io).
        registry: String,
        /// The user name; without it, only `--insecure` is recorded.
        #[arg(short, long)]
        username: Option<String>,
        /// Read the password from standard input (otherwise it is asked for on the terminal).
        #[arg(long)]
        password_stdin: bool,
        /// Speak plain HTTP to this registry (one on this machine or a private network).
        #[arg(long)]
        insecure: bool,
    },
    /// Pull a registry's images from mirrors first, as container runtimes do: each mirror in
    /// turn, then the registry itself; what a mirror gives is checked against the same
    /// digests and keeps the registry's name.
    ///
    /// `forkbox image mirror docker.io http://127.0.0.1:5000` (a mirror given with http:// is
    /// spoken to over plain HTTP); without mirrors, prints those recorded; `--clear` forgets
    /// them. The daemon's next pull uses them.
    Mirror {
        /// The registry mirrored: HOST or HOST:PORT (Docker Hub: docker.io).
        registry: String,
        /// Its mirrors, in the order they are asked: HOST[:PORT], or http://HOST[:PORT].
        mirrors: Vec<String>,
        /// Forget the registry's mirrors.
        #[arg(long)]
        clear: bool,
    },
    /// Forget what `image login` recorded for a registry (its mirrors stay).
    Logout {
        /// The registry: HOST or HOST:PORT.
        registry: String,
    },
    /// Remove an image version (NAME@N). Refused while a sandbox uses it.
    Rm {
        /// The image version to remove: NAME@N.
        reference: String,
        /// Print the result as JSON.
        #[arg(long)]
        json: bool,
    },
}

pub fn image_cmd(paths: &Paths, cmd: ImageCmd) -> anyhow::Result<ExitCode> {
    match cmd {
        ImageCmd::Build {
            file,
            name,
            build_args,
            context,
            if_changed,
            json,
        } => {
            if is_dockerfile(&file) {
                return dockerfile_build(
                    paths,
                    &file,
                    name,
                    &build_args,
                    context,
                    if_changed,
                    json,
                );
            }
            if context.is_some() || !build_args.is_empty() {
                anyhow::bail!(
                    "a build context and --build-arg are for Dockerfiles; {} is a recipe",
                    file.display()
                );
            }
            let (mut recipe, text) = Recipe::load(&file)?;
            if let Some(n) = name {
                recipe.name = n;
            }
            let from = file.display().to_string();
            let build = local::Build {
                recipe,
                source: &text,
                from: &from,
            };
            let built = local::build_image(paths, build, if_changed, false)?;
            if built.up_to_date {
                if json {
                    print_json(&built.image)?;
                } else {
                    println!("{} is up to date with {from}", built.image.reference);
                }
                return Ok(ExitCode::SUCCESS);
            }
            say_built(&built.image, json)
        }
        ImageCmd::Ls { json } => {
            let rows: Vec<ImageView> = local::list_images(paths)?;
            let builds = local::list_builds(paths)?;
            if json {
                print_json(&rows)?;
            } else if rows.is_empty() && builds.is_empty() {
                println!("no images; build one with `forkbox image build -f images/python-bookworm.toml`");
            } else {
                println!(
                    "{:<28} {:<10} {:<24} {:>9} {:>9}",
                    "IMAGE", "SUITE", "KERNEL", "FILES", "DISK"
                );
                for r in rows {
                    println!(
                        "{:<28} {:<10} {:<24} {:>6} MiB {:>6} MiB",
                        r.reference, r.suite, r.kernel, r.content_mib, r.disk_mib
                    );
                }
                for b in builds {
                    println!("{:<28} building: {}", b.name, b.summary());
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        ImageCmd::Login {
            registry,
            username,
            password_stdin,
            insecure,
        } => image_login(paths, &registry, username, password_stdin, insecure),
        ImageCmd::Mirror {
            registry,
            mirrors,
            clear,
        } => image_mirror(paths, &registry, &mirrors, clear),
        ImageCmd::Logout { registry } => image_logout(paths, &registry),
        ImageCmd::Rm { reference, json } => {
            let r: ImageRef = reference.parse()?;
            // A running daemon removes it: it stops its pooled copies of the image first.
            let removed = match serve::remove_image_if_running(paths, &r)? {
                Some(reference) => reference,
                None => local::remove_image(paths, &r)?.reference,
            };
            if json {
                print_json(&serde_json::json!({ "removed": removed }))?;
            } else {
                println!("removed {removed}");
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// `image login`: a registry's credentials (or only that it speaks plain HTTP), kept for pulls.
fn image_login(
    paths: &Paths,
    registry: &str,
    username: Option<String>,
    password_stdin: bool,
    insecure: bool,
) -> anyhow::Result<ExitCode> {
    let registry = registry_key(registry)?;
    let auth = match username {
        Some(user) => {
            let pass = read_password(password_stdin)?;
            use base64::Engine as _;
            Some(base64::engine::general_purpose::STANDARD.encode(format!("{user}:{pass}")))
        }
        None if insecure => None,
        None => anyhow::bail!(
            "give --username (with the password on the terminal or --password-stdin), or --insecure to record only that {registry} speaks plain HTTP"
        ),
    };
    let said = match (&auth, insecure) {
        (Some(_), true) => "credentials, over plain HTTP",
        (Some(_), false) => "credentials",
        _ => "plain HTTP",
    };
    let mut login = oci::logins(paths).remove(&registry).unwrap_or_default();
    login.auth = auth;
    login.insecure = insecure;
    oci::save_login(paths, &registry, Some(login))?;
    println!(
        "{registry}: {said} recorded in {} (readable by root only); used by the next build on one of its images",
        paths.home().join("registries.json").display()
    );
    Ok(ExitCode::SUCCESS)
}

/// `image logout`: forgets what is recorded for a registry.
fn image_logout(paths: &Paths, registry: &str) -> anyhow::Result<ExitCode> {
    let registry = registry_key(registry)?;
    let Some(mut login) = oci::logins(paths).remove(&registry) else {
        anyhow::bail!("nothing is recorded for {registry}");
    };
    // Its mirrors stay (`image mirror --clear` forgets them).
    login.auth = None;
    login.insecure = false;
    let keep = !login.mirrors.is_empty();
    oci::save_login(paths, &registry, keep.then_some(login))?;
    println!("{registry}: forgotten");
    Ok(ExitCode::SUCCESS)
}

/// `image mirror`: the mirrors asked for a registry's images before it.
fn image_mirror(
    paths: &Paths,
    registry: &str,
    mirrors: &[String],
    clear: bool,
) -> anyhow::Result<ExitCode> {
    let registry = registry_key(registry)?;
    let mut all = oci::logins(paths);
    if mirrors.is_empty() && !clear {
        match all
            .get(&registry)
            .map(|l| &l.mirrors)
            .filter(|m| !m.is_empty())
        {
            Some(m) => println!("{registry}: {}", m.join(" ")),
            None => println!("{registry}: no mirrors"),
        }
        return Ok(ExitCode::SUCCESS);
    }
    if clear && !mirrors.is_empty() {
        anyhow::bail!("give mirrors or --clear, not both");
    }
    let mut keys = Vec::new();
    for m in mirrors {
        let key = registry_key(m)?;
        if key == registry {
            anyhow::bail!("{registry} cannot be its own mirror");
        }
        if m.starts_with("http://") {
            all.entry(key.clone()).or_default().insecure = true;
        }
        keys.push(key);
    }
    all.entry(registry.clone()).or_default().mirrors = keys.clone();
    for (r, login) in all {
        let keep = login != oci::Login::default();
        oci::save_login(paths, &r, keep.then_some(login))?;
    }
    match keys.is_empty() {
        true => println!("{registry}: mirrors forgotten"),
        false => println!(
            "{registry}: pulled from {} first, then from {registry}",
            keys.join(", then ")
        ),
    }
    Ok(ExitCode::SUCCESS)
}

/// Whether `image build -f FILE` names a Dockerfile: by its name (`Dockerfile`,
/// `Dockerfile.dev`, `app.dockerfile`), else by its first instruction (`FROM` or `ARG`); a
/// `.toml` file is a recipe.
fn is_dockerfile(file: &std::path::Path) -> bool {
    let name = file
        .file_name()
        .map(|n| n.to_string_lossy().to_ascii_lowercase())
        .unwrap_or_default();
    if name.ends_with(".toml") {
        return false;
    }
    if name.contains("dockerfile") {
        return true;
    }
    let text = std::fs::read_to_string(file).unwrap_or_default();
    text.lines()
        .map(str::trim)
        .find(|l| !l.is_empty() && !l.starts_with('#'))
        .and_then(|l| l.split_whitespace().next())
        .is_some_and(|w| w.eq_ignore_ascii_case("FROM") || w.eq_ignore_ascii_case("ARG"))
}

/// `image build -f Dockerfile`: every instruction in a sandbox, step by step on stderr.
fn dockerfile_build(
    paths: &Paths,
    file: &std::path::Path,
    name: Option<String>,
    build_args: &[String],
    context: Option<PathBuf>,
    if_changed: bool,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let text =
        std::fs::read_to_string(file).with_context(|| format!("cannot read {}", file.display()))?;
    let context = match context {
        Some(c) => c,
        None => file
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .map_or_else(|| PathBuf::from("."), std::path::Path::to_path_buf),
    };
    let name = match name {
        Some(n) => n,
        None => {
            let dir = context.canonicalize().unwrap_or_else(|_| context.clone());
            let n: String = dir
                .file_name()
                .map(|n| n.to_string_lossy().to_ascii_lowercase())
                .unwrap_or_default()
                .chars()
                .map(|c| {
                    if c.is_ascii_alphanumeric() || "-_.".contains(c) {
                        c
                    } else {
                        '-'
                    }
                })
                .collect();
            if !image::valid_name(&n) {
                anyhow::bail!("cannot name the image after {}: give --name", dir.display());
            }
            n
        }
    };
    let mut args = std::collections::BTreeMap::new();
    for a in build_args {
        let (k, v) = a
            .split_once('=')
            .with_context(|| format!("--build-arg {a:?} is not NAME=VALUE"))?;
        args.insert(k.to_string(), v.to_string());
    }
    let req = image::DockerBuild {
        name: &name,
        dockerfile: &text,
        context: image::Context::Dir(&context),
        args,
    };
    let inputs = image::inputs_of(paths, &req)?;
    if if_changed {
        if let Some(img) = image::inputs::same_as_newest(paths, &name, &inputs) {
            if json {
                print_json(&ImageView::from(&img))?;
            } else {
                println!(
                    "{} is up to date with {} (the same Dockerfile, arguments, context files and bases)",
                    img.reference(),
                    file.display()
                );
            }
            return Ok(ExitCode::SUCCESS);
        }
    }
    eprintln!(
        "forkbox: building {name}@{} from {} (context {})",
        ImageStore::new(paths).next_version(&name),
        file.display(),
        context.display()
    );
    let mut log = bundled::printer();
    let img = image::build_dockerfile_of(paths, &req, inputs, &mut log)?;
    say_built(&ImageView::from(&img), json)
}

/// What a build made: its row as JSON, or a line.
fn say_built(img: &ImageView, json: bool) -> anyhow::Result<ExitCode> {
    if json {
        print_json(img)?;
    } else {
        println!(
            "built {} in {:.0} s ({} MiB of files, {} MiB disk)",
            img.reference, img.build_seconds, img.content_mib, img.disk_mib
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// A registry as pulls name it: HOST or HOST:PORT, Docker Hub's names as one.
fn registry_key(registry: &str) -> anyhow::Result<String> {
    let r = registry
        .trim_start_matches("https://")
        .trim_start_matches("http://")
        .trim_end_matches('/');
    let ok = !r.is_empty()
        && !r.contains('/')
        && r.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-.:[]".contains(c));
    if !ok {
        anyhow::bail!(
            "{registry:?} is not a registry: give HOST or HOST:PORT (Docker Hub: docker.io)"
        );
    }
    Ok(match r {
        "docker.io" | "registry-1.docker.io" | "index.docker.io" => "index.docker.io".into(),
        r => r.to_string(),
    })
}

/// A password from standard input (its first line), or typed on the terminal without echo.
fn read_password(from_stdin: bool) -> anyhow::Result<String> {
    use std::io::BufRead;
    let stdin = std::io::stdin();
    let mut line = String::new();
    if from_stdin || !std::io::IsTerminal::is_terminal(&stdin) {
        if !from_stdin {
            anyhow::bail!(
                "standard input is not a terminal: pass the password with --password-stdin"
            );
        }
        stdin.lock().read_line(&mut line)?;
    } else {
        eprint!("Password: ");
        let quiet = terminal::NoEcho::new()?;
        stdin.lock().read_line(&mut line)?;
        drop(quiet);
        eprintln!();
    }
    let pass = line.trim_end_matches(['\n', '\r']).to_string();
    if pass.is_empty() {
        anyhow::bail!("the password is empty");
    }
    Ok(pass)
}
