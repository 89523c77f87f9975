//! deploy/ is checked here because no Docker engine or Kubernetes runs in
//! CI: every manifest parses, and the facts that must agree across files
//! do — replicas, gRPC probes on the serve port, non-root, one image name,
//! the policy file valid with its tokens coming from the Secret, and the
//! Dockerfile's stages. And what ships must start: the binary is run
//! exactly as the Deployment runs it (args, env and mounts read from the
//! manifests, the config directory read-only, a non-root user) and as the
//! image's CMD, and must serve.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_norway::Value;
use tollgate::config::Config;

#[path = "support/process.rs"]
mod process;

const IMAGE: &str = "registry.example.invalid/tollgate:0.1.0";
const PORT: u64 = 50051;
/// The plaintext health-only port the probes use.
const HEALTH_PORT: u64 = 50052;
/// distroless's `nonroot` user, named by the Dockerfile and the Deployment.
const NONROOT: u64 = 65532;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every document of every `deploy/k8s/*.yaml`, by `kind/name`.
fn manifests() -> BTreeMap<String, Value> {
    let mut out = BTreeMap::new();
    let dir = root().join("deploy/k8s");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("deploy/k8s")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    assert!(files.len() >= 7, "{files:?}");
    for file in files {
        let text = std::fs::read_to_string(&file).expect("read manifest");
        for doc in serde_norway::Deserializer::from_str(&text) {
            let value = Value::deserialize(doc)
                .unwrap_or_else(|e| panic!("{} does not parse: {e}", file.display()));
            let kind = value["kind"].as_str().expect("kind").to_owned();
            let name = value["metadata"]["name"].as_str().unwrap_or("").to_owned();
            let key = format!("{kind}/{name}");
            assert!(out.insert(key.clone(), value).is_none(), "{key} twice");
        }
    }
    out
}

fn get<'a>(all: &'a BTreeMap<String, Value>, key: &str) -> &'a Value {
    all.get(key)
        .unwrap_or_else(|| panic!("{key} missing; have {:?}", all.keys()))
}

fn text(path: &Path) -> String {
    std::fs::read_to_string(root().join(path)).expect("read")
}

#[test]
fn the_deployment_asks_for_three_non_root_replicas_probed_over_grpc() {
    let all = manifests();
    let deployment = get(&all, "Deployment/tollgate");
    assert_eq!(deployment["spec"]["replicas"].as_u64(), Some(3));
    let pod = &deployment["spec"]["template"]["spec"];
    assert_eq!(pod["securityContext"]["runAsNonRoot"].as_bool(), Some(true));
    assert_eq!(pod["securityContext"]["runAsUser"].as_u64(), Some(NONROOT));
    let container = &pod["containers"][0];
    assert_eq!(container["image"].as_str(), Some(IMAGE));
    assert_eq!(
        container["securityContext"]["allowPrivilegeEscalation"].as_bool(),
        Some(false)
    );
    assert_eq!(container["ports"][0]["containerPort"].as_u64(), Some(PORT));
    assert_eq!(container["ports"][0]["name"].as_str(), Some("grpc"));
    let listen = container["env"]
        .as_sequence()
        .expect("env")
        .iter()
        .find(|e| e["name"].as_str() == Some("TOLLGATE_LISTEN"))
        .and_then(|e| e["value"].as_str())
        .expect("TOLLGATE_LISTEN");
    assert_eq!(listen, format!("0.0.0.0:{PORT}"));

    // Probes use the plaintext health-only port: kubelet's gRPC probes
    // cannot speak TLS, and the API port serves TLS from a Secret.
    let env = |name: &str| {
        container["env"]
            .as_sequence()
            .expect("env")
            .iter()
            .find(|e| e["name"].as_str() == Some(name))
            .and_then(|e| e["value"].as_str())
            .map(str::to_owned)
    };
    assert_eq!(
        env("TOLLGATE_HEALTH_LISTEN"),
        Some(format!("0.0.0.0:{HEALTH_PORT}"))
    );
    let tls_mount = container["volumeMounts"]
        .as_sequence()
        .expect("mounts")
        .iter()
        .find(|m| m["name"].as_str() == Some("tls"))
        .and_then(|m| m["mountPath"].as_str())
        .expect("the TLS Secret is mounted");
    let cert = env("TOLLGATE_TLS_CERT").expect("TOLLGATE_TLS_CERT");
    assert!(cert.starts_with(tls_mount), "{cert} under {tls_mount}");
    let volumes = pod["volumes"].as_sequence().expect("volumes");
    assert!(
        volumes
            .iter()
            .any(|v| v["name"].as_str() == Some("tls") && v["secret"]["secretName"].is_string()),
        "the TLS volume comes from a Secret"
    );
    let readiness = &container["readinessProbe"]["grpc"];
    assert_eq!(readiness["port"].as_u64(), Some(HEALTH_PORT));
    // Readiness follows the store (NOT_SERVING while Redis is down) ...
    assert_eq!(readiness["service"].as_str(), Some("tollgate.v1.Budget"));
    let liveness = &container["livenessProbe"]["grpc"];
    assert_eq!(liveness["port"].as_u64(), Some(HEALTH_PORT));
    // ... liveness does not, or a Redis outage would restart every pod.
    assert!(liveness["service"].is_null());

    let labels = &deployment["spec"]["template"]["metadata"]["labels"];
    let selector = &deployment["spec"]["selector"]["matchLabels"];
    assert_eq!(labels, selector);
    assert_eq!(&get(&all, "Service/tollgate")["spec"]["selector"], selector);
    assert_eq!(
        &get(&all, "PodDisruptionBudget/tollgate")["spec"]["selector"]["matchLabels"],
        selector
    );
    // The drain (grace_period 10s) fits in the pod's termination grace.
    assert!(pod["terminationGracePeriodSeconds"].as_u64() > Some(10));
}

#[test]
fn service_pdb_and_autoscaler_agree_with_the_deployment() {
    let all = manifests();
    let port = &get(&all, "Service/tollgate")["spec"]["ports"][0];
    assert_eq!(port["port"].as_u64(), Some(PORT));
    assert_eq!(port["targetPort"].as_str(), Some("grpc"));
    assert_eq!(port["appProtocol"].as_str(), Some("grpc"));
    let pdb = get(&all, "PodDisruptionBudget/tollgate");
    assert!(pdb["spec"]["minAvailable"].as_u64() < Some(3));
    let hpa = get(&all, "HorizontalPodAutoscaler/tollgate");
    assert_eq!(
        hpa["spec"]["scaleTargetRef"]["name"].as_str(),
        Some("tollgate")
    );
    assert_eq!(hpa["spec"]["minReplicas"].as_u64(), Some(3));
    assert!(hpa["spec"]["maxReplicas"].as_u64() >= Some(3));
    let kustomization = text(Path::new("deploy/k8s/kustomization.yaml"));
    let kustomization: Value = serde_norway::from_str(&kustomization).expect("kustomization");
    for resource in kustomization["resources"].as_sequence().expect("resources") {
        let file = resource.as_str().expect("file name");
        assert!(root().join("deploy/k8s").join(file).is_file(), "{file}");
    }
}

#[test]
fn the_policy_file_is_valid_and_its_tokens_come_from_the_secret() {
    let all = manifests();
    let policy = get(&all, "ConfigMap/tollgate-policy")["data"]["policy.toml"]
        .as_str()
        .expect("policy.toml");
    let secret = &get(&all, "Secret/tollgate-secrets")["stringData"];
    let config = Config::from_toml(policy, |name| secret[name].as_str().map(str::to_owned));
    let config = config.expect("the ConfigMap's policy file is valid with the Secret's tokens");
    assert!(
        !config.auth.is_open(),
        "deployed coordinators require tokens"
    );
    let store = secret["TOLLGATE_STORE"].as_str().expect("TOLLGATE_STORE");
    tollgate::store::RedisTarget::parse(store).expect("a Redis store URL");
    // The Deployment mounts the ConfigMap where the image's CMD reads it.
    let deployment = get(&all, "Deployment/tollgate");
    let pod = &deployment["spec"]["template"]["spec"];
    assert_eq!(
        pod["volumes"][0]["configMap"]["name"].as_str(),
        Some("tollgate-policy")
    );
    assert_eq!(
        pod["containers"][0]["volumeMounts"][0]["mountPath"].as_str(),
        Some("/etc/tollgate")
    );
    assert_eq!(
        pod["containers"][0]["envFrom"][0]["secretRef"]["name"].as_str(),
        Some("tollgate-secrets")
    );
}

/// The Dockerfile is read, not built (no Docker engine here): its stages,
/// runtime image, user and listen address, and the image name the docs use.
#[test]
fn the_dockerfile_has_a_locked_build_stage_and_a_distroless_non_root_runtime() {
    let dockerfile = text(Path::new("deploy/Dockerfile"));
    let stages: Vec<(String, String)> = dockerfile
        .lines()
        .filter_map(|line| {
            let words: Vec<&str> = line.split_whitespace().collect();
            match words.as_slice() {
                ["FROM", image, as_, name] if as_.eq_ignore_ascii_case("as") => {
                    Some(((*name).to_owned(), (*image).to_owned()))
                }
                _ => None,
            }
        })
        .collect();
    let names: Vec<&str> = stages.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["build", "runtime"], "the expected stages, in order");
    assert!(stages[1].1.contains("distroless"), "small runtime image");
    assert!(dockerfile.contains("COPY --from=build"));
    assert!(dockerfile.contains("--locked"));
    let user = dockerfile
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix("USER "))
        .expect("a USER in the runtime stage");
    assert_eq!(user.trim(), format!("{NONROOT}:{NONROOT}"));
    assert!(dockerfile.contains(&format!("TOLLGATE_LISTEN=0.0.0.0:{PORT}")));
    assert!(
        dockerfile.contains(IMAGE),
        "the build command names the image"
    );
    let ops = text(Path::new("docs/deploying.md"));
    assert!(
        ops.contains(IMAGE),
        "docs/deploying.md names the same image"
    );
    assert!(ops.contains("docker build -f deploy/Dockerfile"));
}

/// A folder standing in for a mount: `files` written into it, then made
/// read-only (or left writable and owned by `owner`).
fn mount(at: &Path, files: &[(String, String)], read_only: bool, owner: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(at).expect("mount point");
    for (name, content) in files {
        let file = at.join(name);
        std::fs::write(&file, content).expect("mounted file");
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o444)).expect("chmod");
    }
    if read_only {
        std::fs::set_permissions(at, std::fs::Permissions::from_mode(0o555)).expect("chmod");
    } else {
        // The owner only: a user who is not root may give a folder to
        // itself, not to a group it is not in.
        std::os::unix::fs::chown(at, Some(owner), None).expect("chown");
    }
}

/// `text` with every container path under a mount replaced by the folder
/// standing in for it.
fn remap(text: &str, mounts: &[(String, PathBuf)]) -> String {
    // The longest mount path first, and only at a path boundary, so
    // `/etc/tollgate` never rewrites `/etc/tollgate-tls/…`.
    let mut by_length: Vec<_> = mounts.iter().collect();
    by_length.sort_by_key(|(inside, _)| std::cmp::Reverse(inside.len()));
    for (inside, outside) in by_length {
        if let Some(rest) = text.strip_prefix(inside.as_str())
            && (rest.is_empty() || rest.starts_with('/'))
        {
            return format!("{}{rest}", outside.display());
        }
    }
    text.to_owned()
}

/// A Secret volume's files: the TLS pair the manifest's Secret would hold,
/// made here (no key is checked in).
fn secret_files(volume: &serde_norway::Value) -> Vec<(String, String)> {
    if volume["secret"]["secretName"].as_str() != Some("tollgate-tls") {
        return Vec::new();
    }
    let key = rcgen::KeyPair::generate().expect("key");
    let params =
        rcgen::CertificateParams::new(vec!["localhost".to_owned()]).expect("certificate params");
    let cert = params.self_signed(&key).expect("self-signed");
    vec![
        ("tls.crt".to_owned(), cert.pem()),
        ("tls.key".to_owned(), key.serialize_pem()),
    ]
}

/// The Deployment's container exactly: its args, its env (and the
/// Secret's, as `envFrom` gives it), its ConfigMap mounted read-only, run
/// as its non-root user. Only what a CI host needs is replaced: the Redis
/// URL (the test's own `redis-server`, not the in-cluster name), the listen
/// and health addresses (loopback, port 0: the bound ports are read from
/// the log) and the TLS Secret's files (a certificate made here). As root
/// the child runs as the manifest's user; otherwise as this user, whom the
/// read-only folders stop just the same.
#[tokio::test]
async fn the_deployment_starts_as_written_with_a_read_only_config_and_no_writable_file() {
    let Some(redis) = tollgate_testkit::RedisServer::start() else {
        return;
    };
    let all = manifests();
    let pod = &get(&all, "Deployment/tollgate")["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    let uid =
        u32::try_from(pod["securityContext"]["runAsUser"].as_u64().expect("uid")).expect("uid");
    assert_eq!(
        container["securityContext"]["readOnlyRootFilesystem"].as_bool(),
        Some(true)
    );
    let (mut command, uid) = process::as_non_root(uid);
    let root = process::temp_dir("deployment");
    let mut mounts = Vec::new();
    let mut placed = Vec::new();
    for m in container["volumeMounts"]
        .as_sequence()
        .expect("volumeMounts")
    {
        let inside = m["mountPath"].as_str().expect("mountPath").to_owned();
        let name = m["name"].as_str().expect("name");
        let volume = pod["volumes"]
            .as_sequence()
            .expect("volumes")
            .iter()
            .find(|v| v["name"].as_str() == Some(name))
            .expect("the mounted volume");
        let outside = root.join(inside.trim_start_matches('/'));
        let files: Vec<(String, String)> = match volume["configMap"]["name"].as_str() {
            Some(map) => get(&all, &format!("ConfigMap/{map}"))["data"]
                .as_mapping()
                .expect("data")
                .iter()
                .map(|(k, v)| {
                    (
                        k.as_str().expect("key").to_owned(),
                        v.as_str().expect("value").to_owned(),
                    )
                })
                .collect(),
            None => secret_files(volume),
        };
        let read_only = m["readOnly"].as_bool() == Some(true) || volume["configMap"].is_mapping();
        mount(&outside, &files, read_only, uid);
        placed.push(files.len());
        mounts.push((inside, outside));
    }
    let args: Vec<String> = container["args"]
        .as_sequence()
        .expect("args")
        .iter()
        .map(|a| remap(a.as_str().expect("arg"), &mounts))
        .collect();
    command.args(&args).current_dir(&root).env_clear();
    let secret = get(&all, "Secret/tollgate-secrets");
    for from in container["envFrom"].as_sequence().into_iter().flatten() {
        let name = from["secretRef"]["name"].as_str().expect("secretRef");
        assert_eq!(name, "tollgate-secrets");
        for (k, v) in secret["stringData"].as_mapping().expect("stringData") {
            command.env(k.as_str().expect("name"), v.as_str().expect("value"));
        }
    }
    for e in container["env"].as_sequence().expect("env") {
        let value = e["value"].as_str().expect("a literal env value");
        command.env(e["name"].as_str().expect("name"), remap(value, &mounts));
    }
    // The API port serves TLS; readiness is asked on the plaintext
    // health-only port, as the manifest's probes do.
    command
        .env("TOLLGATE_STORE", redis.url())
        .env("TOLLGATE_LISTEN", "127.0.0.1:0")
        .env("TOLLGATE_HEALTH_LISTEN", "127.0.0.1:0");
    let mut served =
        process::Served::spawn(command, &root.join("serve.log")).probing_health_listener();
    served.until_serving().await;
    // It serves with nothing written anywhere it was given.
    for ((_, outside), placed) in mounts.iter().zip(&placed) {
        let entries = std::fs::read_dir(outside).expect("mount").count();
        assert_eq!(entries, *placed, "the pod wrote into {}", outside.display());
    }
    drop(served);
    let _ = std::fs::remove_dir_all(&root);
}

/// The arguments of the Dockerfile's `CMD ["…", …]`.
fn dockerfile_cmd() -> Vec<String> {
    let dockerfile = text(Path::new("deploy/Dockerfile"));
    let line = dockerfile
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix("CMD "))
        .expect("a CMD");
    serde_json::from_str(line).expect("CMD in exec form")
}

/// The image as `docker run -v policy:/etc/tollgate:ro` starts it: the
/// CMD's args, its non-root user, the policy read-only, the image's own
/// state folder writable (the image creates it owned by that user), no
/// Redis (a lone coordinator).
#[tokio::test]
async fn the_image_cmd_starts_with_a_read_only_policy_mount() {
    let (mut command, uid) = process::as_non_root(NONROOT as u32);
    let all = manifests();
    let policy = get(&all, "ConfigMap/tollgate-policy")["data"]["policy.toml"]
        .as_str()
        .expect("policy.toml")
        .to_owned();
    let root = process::temp_dir("image");
    let mounts = vec![
        ("/etc/tollgate".to_owned(), root.join("etc/tollgate")),
        (
            "/var/lib/tollgate".to_owned(),
            root.join("var/lib/tollgate"),
        ),
    ];
    mount(&mounts[0].1, &[("policy.toml".into(), policy)], true, uid);
    mount(&mounts[1].1, &[], false, uid);
    let dockerfile = text(Path::new("deploy/Dockerfile"));
    assert!(dockerfile.contains("VOLUME /var/lib/tollgate"));
    assert!(dockerfile.contains("--chown=65532:65532 /out/state /var/lib/tollgate"));
    let args: Vec<String> = dockerfile_cmd().iter().map(|a| remap(a, &mounts)).collect();
    let secret = get(&all, "Secret/tollgate-secrets");
    command.args(&args).current_dir(&root).env_clear();
    for (k, v) in secret["stringData"].as_mapping().expect("stringData") {
        let name = k.as_str().expect("name");
        if name != "TOLLGATE_STORE" {
            command.env(name, v.as_str().expect("value"));
        }
    }
    command.env("TOLLGATE_LISTEN", "127.0.0.1:0");
    let mut served = process::Served::spawn(command, &root.join("serve.log"));
    served.until_serving().await;
    assert!(
        mounts[1].1.join("state.json").is_file(),
        "the lone coordinator keeps its runtime state in the image's state folder"
    );
    drop(served);
    let _ = std::fs::remove_dir_all(&root);
}

/// A lone coordinator whose files would land on a read-only mount says so
/// in one line naming the file and the flag that moves it, and exits.
#[tokio::test]
async fn a_read_only_policy_folder_without_redis_fails_in_one_line_naming_the_flag() {
    let (mut command, _) = process::as_non_root(NONROOT as u32);
    let root = process::temp_dir("readonly");
    let etc = root.join("etc");
    mount(
        &etc,
        &[("policy.toml".into(), "[defaults]\n".into())],
        true,
        0,
    );
    command
        .args(["serve", "--config"])
        .arg(etc.join("policy.toml"))
        .args(["--listen", "127.0.0.1:0"])
        .current_dir(&root)
        .env_clear();
    let (status, log) = process::launch(command, &root.join("serve.log"))
        .exit()
        .await;
    assert!(!status.success());
    let last = log
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .expect("an error line");
    assert!(last.starts_with("tollgate serve: "), "{log}");
    assert!(
        last.contains("policy.toml.audit.jsonl"),
        "names the file: {last}"
    );
    assert!(last.contains("--audit-log"), "names the flag: {last}");
    assert!(
        !log.contains("panicked") && !log.contains("Caused by"),
        "{log}"
    );
    let _ = std::fs::remove_dir_all(&root);
}

/// The example Pod with `tollgate proxy` beside an application: its
/// ConfigMap's file is valid for the proxy's own parser, the container
/// reads it where it is mounted, the probes ask the admin port the file
/// opens, and the pod's grace outlasts the proxy's drain.
#[test]
fn the_proxy_pod_example_agrees_with_the_proxy() {
    let text = text(Path::new("deploy/proxy/pod.yaml"));
    let docs: Vec<Value> = serde_norway::Deserializer::from_str(&text)
        .map(|doc| Value::deserialize(doc).expect("deploy/proxy/pod.yaml parses"))
        .collect();
    let kind = |k: &str| {
        docs.iter()
            .find(|d| d["kind"].as_str() == Some(k))
            .unwrap_or_else(|| panic!("a {k}"))
    };
    let file = kind("ConfigMap")["data"]["proxy.toml"]
        .as_str()
        .expect("proxy.toml");
    let config = tollgate::proxy::ProxyConfig::from_toml(file).expect("the proxy accepts it");
    let pod = kind("Pod");
    let containers = pod["spec"]["containers"].as_sequence().expect("containers");
    let proxy = containers
        .iter()
        .find(|c| c["name"].as_str() == Some("tollgate-proxy"))
        .expect("the proxy container");
    let args: Vec<&str> = proxy["args"]
        .as_sequence()
        .expect("args")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(args[..2], ["proxy", "--config"]);
    let mount = proxy["volumeMounts"]
        .as_sequence()
        .expect("mounts")
        .iter()
        .find(|m| m["name"].as_str() == Some("config"))
        .and_then(|m| m["mountPath"].as_str())
        .expect("the config mount");
    assert_eq!(args[2], format!("{mount}/proxy.toml"));
    let admin = config.admin_listen.expect("an admin listener");
    assert_eq!(
        proxy["ports"][0]["containerPort"].as_u64(),
        Some(u64::from(admin.port()))
    );
    assert_eq!(
        proxy["readinessProbe"]["httpGet"]["path"].as_str(),
        Some("/readyz")
    );
    assert_eq!(
        proxy["livenessProbe"]["httpGet"]["path"].as_str(),
        Some("/healthz")
    );
    let grace = pod["spec"]["terminationGracePeriodSeconds"]
        .as_u64()
        .expect("a grace period");
    assert!(grace > config.drain.as_secs(), "the pod outlasts the drain");
    let app_calls = containers
        .iter()
        .flat_map(|c| c["env"].as_sequence().into_iter().flatten())
        .filter_map(|e| e["value"].as_str())
        .any(|v| v == format!("http://{}", config.listeners[0].listen));
    assert!(app_calls, "the application calls the proxy's listener");
}
