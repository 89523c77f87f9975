//! deploy/ is checked here because no Docker engine or Kubernetes runs in
//! CI: every manifest parses, and the facts that must agree across files
//! do — replicas, gRPC probes on the serve port, non-root, one image name,
//! the policy file valid with its tokens coming from the Secret, and the
//! Dockerfile's stages.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_norway::Value;
use tollgate::config::Config;

const IMAGE: &str = "registry.example.invalid/tollgate:0.1.0";
const PORT: u64 = 50051;
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
fn the_deployment_runs_three_non_root_replicas_probed_over_grpc() {
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

    let readiness = &container["readinessProbe"]["grpc"];
    assert_eq!(readiness["port"].as_u64(), Some(PORT));
    // Readiness follows the store (NOT_SERVING while Redis is down) ...
    assert_eq!(readiness["service"].as_str(), Some("tollgate.v1.Budget"));
    let liveness = &container["livenessProbe"]["grpc"];
    assert_eq!(liveness["port"].as_u64(), Some(PORT));
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

#[test]
fn the_dockerfile_builds_then_runs_non_root_in_a_small_image() {
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
