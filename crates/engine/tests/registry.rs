//! Images from an OCI registry, end to end: a real `docker-registry` on loopback, seeded with
//! images these tests write themselves (a Debian root from mmdebstrap, hand-made layers with
//! whiteouts, hostile layers) and pushed with skopeo. Costs: the Debian root once per machine
//! (~40 s); the build with a step boots one VM (~10 s under TCG) and the check boots another.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

use std::path::Path;

use forkbox_engine::image::oci::{save_login, Login};
use forkbox_engine::image::{self, ImageRef, ImageStore, Recipe};
use forkbox_engine::paths::Paths;
use forkbox_engine::sandbox::{Sandbox, SandboxConfig};
use forkbox_test_infra as infra;
use infra::registry::{debian_layer, layer, write_layout, Config, Entry, Registry};

/// Removes what an earlier, interrupted run left of image `name` (the images are shared).
fn forget(paths: &Paths, name: &str) {
    let store = ImageStore::new(paths);
    for img in store.list().into_iter().filter(|i| i.meta.name == name) {
        let _ = store.remove(&img.reference().parse().unwrap(), &[]);
    }
}

fn insecure(paths: &Paths, reg: &Registry) {
    save_login(
        paths,
        &reg.addr,
        Some(Login {
            auth: None,
            insecure: true,
            mirrors: vec![],
        }),
    )
    .unwrap();
}

fn build(paths: &Paths, text: &str) -> (Result<image::Image, String>, Vec<String>) {
    let recipe = Recipe::parse(text).unwrap();
    let mut log = Vec::new();
    let r = image::build(paths, &recipe, text, &mut |ev| {
        log.push(match ev {
            image::BuildEvent::Step { n, total, what } => format!("[{n}/{total}] {what}"),
            image::BuildEvent::Log(l) => l,
        })
    });
    (r.map_err(|e| e.to_string()), log)
}

/// A second layer over Debian: a user, a working directory, a whiteout, an opaque directory
/// with a new file, a hard link.
fn app_layer() -> Vec<u8> {
    let passwd = "root:x:0:0:root:/root:/bin/bash\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\napp:x:1001:1001::/home/app:/bin/sh\n";
    layer(&[
        Entry::File("etc/passwd", passwd, 0o644),
        Entry::Dir("home/app", 0o755),
        Entry::Dir("srv/app", 0o755),
        Entry::File("srv/app/hello.txt", "hello from a layer\n", 0o644),
        Entry::HardLink("srv/app/hello-again.txt", "srv/app/hello.txt"),
        Entry::File("etc/.wh.issue", "", 0o644),
        Entry::File("usr/share/doc/.wh..wh..opq", "", 0o644),
        Entry::File("usr/share/doc/forkbox/README", "only me\n", 0o644),
    ])
}

#[test]
fn registry_images_unpack_with_whiteouts_pin_their_digest_and_build_in_a_vm() {
    let paths = infra::isolated_home("registry-build");
    forget(&paths, "reg-built");
    let reg = Registry::start(None);
    insecure(&paths, &reg);
    let t = tempfile::tempdir().unwrap();
    let layout = t.path().join("layout");
    let manifest = write_layout(
        &layout,
        &[debian_layer(&paths), app_layer()],
        &Config {
            env: &[
                "PATH=/usr/local/bin:/usr/bin:/bin",
                "GREETING=from-the-config",
            ],
            workdir: Some("/srv/app"),
            user: Some("app"),
        },
    );
    reg.push(&layout, "team/base:1");
    let reference = format!("{}/team/base:1", reg.addr);
    let text = format!(
        "name = \"reg-built\"\nbase = \"{reference}\"\nrun = [\"uname -r > /built-kernel; id -u > /built-uid; touch /srv/app/built\"]\n[env]\nRECIPE = \"yes\"\n"
    );
    // Layers kept from an earlier run would hide the pull: this run fetches them.
    forkbox_engine::tree::remove_tree(&paths.home().join("oci/blobs")).unwrap();
    let t = std::time::Instant::now();
    let (img, log) = build(&paths, &text);
    let img = img.unwrap_or_else(|e| panic!("{e}\n{}", log.join("\n")));
    println!(
        "FIGURE registry build: pull 2 layers (72 MB gzip) from loopback, unpack, ext4, one run step in a VM: {:.1} s",
        t.elapsed().as_secs_f64()
    );
    let pinned = format!("{}/team/base@{manifest}", reg.addr);
    assert_eq!(img.meta.pulled.as_deref(), Some(pinned.as_str()));
    assert_eq!(img.meta.recipe.base.as_deref(), Some(pinned.as_str()));
    assert_eq!(img.meta.suite, "bookworm");
    assert_eq!(img.meta.workdir.as_deref(), Some("/srv/app"));
    assert_eq!(img.meta.user.as_deref(), Some("app"));
    assert!(
        log.iter()
            .any(|l| l.contains("[4/5]") && l.contains("sandbox")),
        "{log:?}"
    );
    assert!(log.iter().any(|l| l.contains("layer 2/2")), "{log:?}");

    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let cfg = SandboxConfig {
            image: ImageRef {
                name: "reg-built".into(),
                version: Some(img.meta.version),
            },
            ..Default::default()
        };
        let sb = Sandbox::create(&paths, &cfg).await.unwrap();
        let out = sb
            .run(infra::sh(
                "echo user=$(id -un) pwd=$(pwd) greeting=$GREETING recipe=$RECIPE; \
                 cat /built-uid; echo kernel-match=$([ \"$(cat /built-kernel)\" = \"$(uname -r)\" ] && echo yes); \
                 cat hello-again.txt; ls /usr/share/doc; test -e /etc/issue && echo issue-present; \
                 test -e built && echo step-ran; stat -c %h hello.txt",
                Some(60_000),
            ))
            .await
            .unwrap();
        sb.destroy().await;
        let text = out.stdout_text();
        assert_eq!(out.code(), 0, "{text}{}", String::from_utf8_lossy(&out.stderr));
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines,
            [
                "user=app pwd=/srv/app greeting=from-the-config recipe=yes",
                // The step ran as root, in a VM whose kernel is forkbox's guest kernel.
                "0",
                "kernel-match=yes",
                "hello from a layer",
                "forkbox",
                "step-ran",
                "2",
            ],
            "{text}"
        );
    });

    // A rebuild reads the same layers, kept by digest, and pins the same manifest.
    let t = std::time::Instant::now();
    let (again, log) = build(&paths, &text);
    let again = again.unwrap();
    println!(
        "FIGURE registry rebuild (layers kept by digest): {:.1} s",
        t.elapsed().as_secs_f64()
    );
    assert_eq!(again.meta.pulled, img.meta.pulled);
    assert!(
        log.iter()
            .filter(|l| l.contains("kept from an earlier pull"))
            .count()
            == 2,
        "{log:?}"
    );
    for v in [img.meta.version, again.meta.version] {
        ImageStore::new(&paths)
            .remove(
                &ImageRef {
                    name: "reg-built".into(),
                    version: Some(v),
                },
                &[],
            )
            .unwrap();
    }
}

#[test]
fn hostile_layers_and_wrong_digests_are_refused_without_writing_outside() {
    let paths = infra::isolated_home("registry-hostile");
    let reg = Registry::start(None);
    insecure(&paths, &reg);
    let t = tempfile::tempdir().unwrap();
    let outside = t.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    let target = outside.display().to_string();
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "dotdot",
            layer(&[Entry::File(
                "../../../../../../tmp/forkbox-owned",
                "x",
                0o644,
            )]),
            "`..`",
        ),
        (
            "abslink",
            layer(&[
                Entry::Symlink("escape", &target),
                Entry::File("escape/owned", "x", 0o644),
            ]),
            "leads out",
        ),
    ];
    for (name, hostile, why) in cases {
        let dir = t.path().join(name);
        write_layout(
            &dir,
            &[layer(&[Entry::Dir("etc", 0o755)]), hostile],
            &Config::default(),
        );
        reg.push(&dir, &format!("evil/{name}:1"));
        let (r, _) = build(
            &paths,
            &format!(
                "name = \"reg-evil\"\nbase = \"{}/evil/{name}:1\"\n",
                reg.addr
            ),
        );
        let e = r.unwrap_err();
        eprintln!("{e}");
        assert!(e.contains("refused") && e.contains(why), "{name}: {e}");
    }
    assert!(!Path::new("/tmp/forkbox-owned").exists());
    assert_eq!(
        std::fs::read_dir(&outside).unwrap().count(),
        0,
        "written outside"
    );
    assert!(ImageStore::new(&paths)
        .resolve(&"reg-evil".parse().unwrap())
        .is_err());

    // A blob whose bytes are not its digest's (the registry's copy changed) is refused, and
    // nothing of it is kept.
    let dir = t.path().join("tampered");
    let good = layer(&[Entry::File("etc/motd", "original\n", 0o644)]);
    write_layout(&dir, std::slice::from_ref(&good), &Config::default());
    reg.push(&dir, "evil/tampered:1");
    let blob = reg.blob_file(&infra::registry::digest(&good));
    let mut bytes = std::fs::read(&blob).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    std::fs::write(&blob, bytes).unwrap();
    let on_tampered = format!(
        "name = \"reg-evil\"\nbase = \"{}/evil/tampered:1\"\n",
        reg.addr
    );
    let (r, _) = build(&paths, &on_tampered);
    let e = r.unwrap_err();
    eprintln!("{e}");
    assert!(e.contains("do not match its digest"), "{e}");
    let kept: Vec<_> = std::fs::read_dir(paths.home().join("oci/blobs"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    let hex = infra::registry::digest(&good)
        .trim_start_matches("sha256:")
        .to_string();
    assert!(
        !kept.iter().any(|k| k.contains(&hex)),
        "tampered blob kept: {kept:?}"
    );

    // A blob longer than the manifest says is cut off at the declared size, before the host
    // keeps more of it than that.
    let mut longer = good.clone();
    longer.extend(std::iter::repeat_n(0u8, 4 << 20));
    std::fs::write(&blob, &longer).unwrap();
    let (r, _) = build(&paths, &on_tampered);
    let e = r.unwrap_err();
    eprintln!("{e}");
    assert!(e.contains("more than the"), "{e}");
}

#[test]
fn private_registries_take_the_right_password_and_refuse_the_wrong_one_in_words() {
    let paths = infra::isolated_home("registry-auth");
    let reg = Registry::start(Some("agent:s3cret"));
    insecure(&paths, &reg);
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("private");
    write_layout(
        &dir,
        &[layer(&[Entry::File("etc/private", "yes\n", 0o644)])],
        &Config::default(),
    );
    reg.push(&dir, "private/img:1");
    let recipe = format!(
        "name = \"reg-private\"\nbase = \"{}/private/img:1\"\n",
        reg.addr
    );

    let (r, _) = build(&paths, &recipe);
    let e = r.unwrap_err();
    assert!(
        e.contains("asks for credentials") && e.contains("forkbox image login"),
        "{e}"
    );

    let with = |creds: &str| {
        use base64::Engine as _;
        Login {
            auth: Some(base64::engine::general_purpose::STANDARD.encode(creds)),
            insecure: true,
            mirrors: vec![],
        }
    };
    save_login(&paths, &reg.addr, Some(with("agent:wrong"))).unwrap();
    let (r, _) = build(&paths, &recipe);
    let e = r.unwrap_err();
    eprintln!("{e}");
    assert!(e.contains("refused the credentials"), "{e}");

    save_login(&paths, &reg.addr, Some(with("agent:s3cret"))).unwrap();
    let (r, log) = build(&paths, &recipe);
    let img = r.unwrap_or_else(|e| panic!("{e}\n{}", log.join("\n")));
    assert_eq!(img.meta.suite, "unknown", "a root without /etc/os-release");

    // The API (and so the SDKs and the daemon) takes the same base in a recipe, and builds on
    // its blocking pool.
    let seed = forkbox_engine::image::Seed {
        base: Some(format!("{}/private/img:1", reg.addr)),
        ..Default::default()
    };
    let recipe = Recipe::from_seed("reg-private", seed).unwrap();
    let engine = forkbox_engine::api::Engine::private(paths.clone());
    let rt = tokio::runtime::Runtime::new().unwrap();
    let view = rt
        .block_on(engine.call(forkbox_engine::api::ops::BuildImage {
            recipe,
            source: None,
            if_changed: false,
            events: None,
        }))
        .unwrap();
    assert!(
        view.pulled
            .as_deref()
            .is_some_and(|p| p.contains("@sha256:")),
        "{view:?}"
    );
    ImageStore::new(&paths)
        .remove(&view.reference.parse().unwrap(), &[])
        .unwrap();
    let _ = ImageStore::new(&paths).remove(
        &ImageRef {
            name: "reg-private".into(),
            version: Some(img.meta.version),
        },
        &[],
    );
}

/// The Debian image the registry tests push (a minbase root and the app layer).
fn push_base(paths: &Paths, reg: &Registry, dir: &Path) -> String {
    write_layout(
        dir,
        &[debian_layer(paths), app_layer()],
        &Config {
            env: &["PATH=/usr/local/bin:/usr/bin:/bin"],
            workdir: Some("/srv/app"),
            user: None,
        },
    );
    reg.push(dir, "team/base:1");
    format!("{}/team/base:1", reg.addr)
}

#[test]
fn dockerfiles_build_stage_by_stage_in_sandboxes() {
    let paths = infra::isolated_home("registry-dockerfile");
    forget(&paths, "reg-docker");
    let reg = Registry::start(None);
    insecure(&paths, &reg);
    let t = tempfile::tempdir().unwrap();
    let base = push_base(&paths, &reg, &t.path().join("layout"));
    let ctx = t.path().join("ctx");
    std::fs::create_dir_all(ctx.join("app")).unwrap();
    std::fs::create_dir_all(ctx.join("node_modules/junk")).unwrap();
    std::fs::write(ctx.join("node_modules/junk/index.js"), "x").unwrap();
    std::fs::write(ctx.join("package.json"), "{}").unwrap();
    std::fs::write(ctx.join("package-lock.json"), "{}").unwrap();
    std::fs::write(ctx.join("app/hello.sh"), "#!/bin/sh\necho hello\n").unwrap();
    std::fs::set_permissions(
        ctx.join("app/hello.sh"),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    std::fs::write(ctx.join(".dockerignore"), "node_modules\n").unwrap();
    let mut archive = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    h.set_path("inside.txt").unwrap();
    h.set_size(3);
    h.set_mode(0o644);
    h.set_cksum();
    archive.append(&h, &b"in\n"[..]).unwrap();
    std::fs::write(ctx.join("data.tar"), archive.into_inner().unwrap()).unwrap();
    let dockerfile = r#"ARG BASE
FROM ${BASE} AS build
ARG GREETING=hi
WORKDIR /src
COPY package*.json ./
COPY app/ app/
RUN echo "$GREETING from $(uname -r)" > out.txt && ls -A /src > listing
ENV STAGE=build

FROM ${BASE}
COPY --from=build /src/out.txt /opt/out.txt
COPY --from=build /src /opt/src
COPY --chown=app:1001 app/hello.sh /usr/local/bin/hello
ADD data.tar /opt/data/
ENV MODE="final stage"
USER app
WORKDIR /home/app
LABEL team=forkbox
CMD ["hello"]
"#;
    let mut log = Vec::new();
    let args = [
        ("BASE".to_string(), base.clone()),
        ("GREETING".to_string(), "hey".to_string()),
    ]
    .into_iter()
    .collect();
    let t = std::time::Instant::now();
    let img = image::build_dockerfile(
        &paths,
        &image::DockerBuild {
            name: "reg-docker",
            dockerfile,
            context: image::Context::Dir(&ctx),
            args,
        },
        &mut |ev| {
            log.push(match ev {
                image::BuildEvent::Step { n, total, what } => format!("[{n}/{total}] {what}"),
                image::BuildEvent::Log(l) => l,
            })
        },
    )
    .unwrap_or_else(|e| panic!("{e}"));
    println!(
        "FIGURE Dockerfile build: 2 stages (3 VMs: one per stage, and the first stage again to copy from), 17 instructions: {:.1} s",
        t.elapsed().as_secs_f64()
    );
    assert!(
        log.iter().any(|l| l.contains("line 19: CMD is recorded")),
        "{log:?}"
    );
    assert_eq!(img.meta.user.as_deref(), Some("app"));
    assert_eq!(img.meta.workdir.as_deref(), Some("/home/app"));
    assert_eq!(
        img.meta.env.get("MODE").map(String::as_str),
        Some("final stage")
    );
    assert!(!img.meta.env.contains_key("STAGE"), "{:?}", img.meta.env);
    assert!(img
        .meta
        .pulled
        .as_deref()
        .is_some_and(|p| p.contains("@sha256:")));
    assert!(img.dir.join("Dockerfile").is_file());
    // Asked again with the same inputs, the build is this image (nothing runs); another
    // argument is another build.
    let again = |greeting: &str| {
        let args = [
            ("BASE".to_string(), base.clone()),
            ("GREETING".to_string(), greeting.to_string()),
        ]
        .into_iter()
        .collect();
        let req = image::DockerBuild {
            name: "reg-docker",
            dockerfile,
            context: image::Context::Dir(&ctx),
            args,
        };
        let inputs = image::inputs_of(&paths, &req).unwrap();
        image::inputs::same_as_newest(&paths, "reg-docker", &inputs)
    };
    assert_eq!(again("hey").map(|i| i.reference()), Some(img.reference()));
    assert!(again("hi").is_none());

    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let cfg = SandboxConfig {
            image: ImageRef {
                name: "reg-docker".into(),
                version: Some(img.meta.version),
            },
            ..Default::default()
        };
        let sb = Sandbox::create(&paths, &cfg).await.unwrap();
        let out = sb
            .run(infra::sh(
                "echo $(id -un) $(pwd) \"$MODE\"; \
                 echo out=$(cut -d' ' -f1,2 /opt/out.txt) kernel=$([ \"$(cut -d' ' -f3 /opt/out.txt)\" = \"$(uname -r)\" ] && echo guest); \
                 tr '\\n' ' ' < /opt/src/listing; echo; \
                 stat -c '%U %a' /usr/local/bin/hello; cat /opt/data/inside.txt; ls /opt/src",
                Some(60_000),
            ))
            .await
            .unwrap();
        sb.destroy().await;
        let text = out.stdout_text();
        assert_eq!(out.code(), 0, "{text}{}", String::from_utf8_lossy(&out.stderr));
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines,
            [
                "app /home/app final stage",
                "out=hey from kernel=guest",
                "app listing out.txt package-lock.json package.json ",
                "app 755",
                "in",
                "app",
                "listing",
                "out.txt",
                "package-lock.json",
                "package.json",
            ],
            "{text}"
        );
    });
    ImageStore::new(&paths)
        .remove(
            &format!("reg-docker@{}", img.meta.version).parse().unwrap(),
            &[],
        )
        .unwrap();

    // A failing RUN names its line and how it ended; nothing is kept.
    let e = image::build_dockerfile(
        &paths,
        &image::DockerBuild {
            name: "reg-docker",
            dockerfile: &format!("FROM {base}\nRUN echo about to fail >&2; exit 3\n"),
            context: image::Context::Dir(&ctx),
            args: Default::default(),
        },
        &mut |_| {},
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("line 2") && e.contains("exit status 3") && e.contains("about to fail"),
        "{e}"
    );
    assert!(ImageStore::new(&paths)
        .resolve(&"reg-docker".parse().unwrap())
        .is_err());
}

/// A registry this host cannot reach, its images pulled through its mirrors (`image mirror`):
/// a dead mirror is passed over for the next, the image keeps the registry's name and is
/// pinned by the digest the mirror served, and with every mirror dead the error names each.
#[test]
fn a_registry_is_pulled_through_its_mirrors_in_turn() {
    use forkbox_engine::image::oci::{logins, parse_reference, pull};
    let paths = infra::isolated_home("registry-mirror");
    let _ = std::fs::remove_file(paths.home().join("registries.json"));
    let reg = Registry::start(None);
    let t = tempfile::tempdir().unwrap();
    let layout = t.path().join("layout");
    let tool = layer(&[Entry::File("opt/tool/hello", "from the mirror\n", 0o644)]);
    let manifest = write_layout(&layout, &[tool], &Config::default());
    reg.push(&layout, "team/tool:1");
    // A port nothing listens on: a mirror that is down.
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().to_string()
    };
    let upstream = "registry.invalid";
    let mirrored = |mirrors: Vec<String>| {
        for m in [&dead, &reg.addr] {
            save_login(
                &paths,
                m,
                Some(Login {
                    auth: None,
                    insecure: true,
                    mirrors: vec![],
                }),
            )
            .unwrap();
        }
        let mut l = logins(&paths).remove(upstream).unwrap_or_default();
        l.mirrors = mirrors;
        save_login(&paths, upstream, Some(l)).unwrap();
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    let reference = parse_reference(&format!("{upstream}/team/tool:1")).unwrap();
    let mut events = 0;
    let mut pull_now = || rt.block_on(pull(&paths, &reference, &mut |_| events += 1));

    let err = pull_now().unwrap_err().to_string();
    assert!(err.contains("registry.invalid"), "{err}");

    mirrored(vec![dead.clone(), reg.addr.clone()]);
    let pulled = pull_now().unwrap();
    assert_eq!(pulled.pinned, format!("{upstream}/team/tool@{manifest}"));
    assert_eq!(pulled.digest, manifest);
    assert_eq!(pulled.layers.len(), 1);

    // Two pulls of it at once (two templates built FROM one image) each get it whole.
    forkbox_engine::tree::remove_tree(&paths.home().join("oci/blobs")).unwrap();
    let (one, two) = rt.block_on(async {
        let (mut a, mut b) = (|_| {}, |_| {});
        tokio::join!(
            pull(&paths, &reference, &mut a),
            pull(&paths, &reference, &mut b)
        )
    });
    assert_eq!(one.unwrap().digest, two.unwrap().digest);

    mirrored(vec![dead.clone()]);
    let err = pull_now().unwrap_err().to_string();
    assert!(
        err.contains(&format!("after its mirrors: mirror {dead}")),
        "{err}"
    );
}
