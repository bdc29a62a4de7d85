//! A faithful stand-in for the Azure Pipelines agent package, and a rootfs that can run it.
//!
//! The package ([`package`]): `config.sh`, `run.sh` and `env.sh` written for these tests
//! to behave as `shared/azure-agent-entrypoints.md` describes Microsoft's (bash; `run.sh`
//! runs the listener as a child with no `exec` and no `trap`; the uid-0 refusals;
//! `config.sh`'s `ldd` checks of the three .NET libraries and its `ldconfig -NXv` libicu
//! check, with their messages and exit codes; `run.sh`'s exit-code-4 update retry), a
//! stand-in `bin/Agent.Listener` (bash, HTTP over `/dev/tcp`) that speaks the fake Azure
//! DevOps's protocol ([`super::fake_azure`]): it configures (`.agent`, `.credentials`,
//! `.credentials_rsaparams`, `_diag/Agent_*.log`), takes one job with `run --once`, and on
//! SIGINT/SIGTERM during a job records the signal, cancels the job's steps (SIGINT, then
//! SIGTERM, then SIGKILL), reports it "canceled", deletes its session and exits 0, as the
//! real listener does. The .NET native libraries are real ELF shared objects built here
//! with `cc`, with the DT_NEEDED entries of the real ones (libcoreclr: libstdc++,
//! libpthread, libdl, libm; the OpenSSL shim: libssl, libcrypto; the compression shim:
//! libz), so `ldd` in the rootfs really finds or misses them.
//!
//! The rootfs ([`agent_rootfs_tar`]): the shipped recipe `debian-bookworm-agent` (minbase
//! plus the agent's dependencies and an `azp` user), built once with `rootfs build` and
//! cached as a tarball in the fixtures dir.
#![allow(dead_code)]

use super::{bin, fixtures, repo};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The version the package calls itself (its file name says it to `--agent-package`).
pub const VERSION: &str = "4.252.0";

/// How a package differs from the faithful one.
#[derive(Debug, Clone, Default)]
pub struct Variant {
    /// One more DT_NEEDED of `libcoreclr.so`, a library no rootfs has: config.sh's ldd
    /// check fails as it does for a rootfs missing a real dependency.
    pub coreclr_needs: Option<&'static str>,
    /// Seconds the listener waits between taking a job and showing it on disk (its
    /// Worker log): the real one renews the job request and starts its worker first.
    pub dispatch_delay_s: u32,
    /// Seconds the job's shell takes before it makes its steps' process group (a busy
    /// machine's slow fork and exec): a cancel meanwhile finds no group yet.
    pub steps_group_delay_s: u32,
}

/// The package as a `.tar.gz`, written to `dir/vsts-agent-linux-x64-<VERSION>.tar.gz`.
pub fn write_package(dir: &Path, variant: &Variant) -> PathBuf {
    let out = dir.join(format!("vsts-agent-linux-x64-{VERSION}.tar.gz"));
    std::fs::write(&out, package(variant)).unwrap();
    out
}

/// The package's bytes (`.tar.gz`).
pub fn package(variant: &Variant) -> Vec<u8> {
    let libs = native_libs(variant);
    let gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    let mut tar = tar::Builder::new(gz);
    let mut add = |path: &str, mode: u32, body: &[u8]| {
        let mut h = tar::Header::new_gnu();
        h.set_mode(mode);
        h.set_size(body.len() as u64);
        h.set_mtime(1_700_000_000);
        tar.append_data(&mut h, path, body).unwrap();
    };
    add("config.sh", 0o755, CONFIG_SH.as_bytes());
    add("run.sh", 0o755, RUN_SH.as_bytes());
    add("env.sh", 0o755, ENV_SH.as_bytes());
    add(
        "bin/Agent.Listener",
        0o755,
        LISTENER
            .replace("@VERSION@", VERSION)
            .replace("@DISPATCH_DELAY@", &variant.dispatch_delay_s.to_string())
            .replace("@STEPS_GROUP_DELAY@", &variant.steps_group_delay_s.to_string())
            .as_bytes(),
    );
    for (name, bytes) in &libs {
        add(&format!("bin/{name}"), 0o755, bytes);
    }
    // Node 20 for task handlers (needs glibc >= 2.28): only its place matters here.
    add("externals/node20_1/bin/node", 0o755, b"#!/bin/sh\necho v20.18.0\n");
    tar.into_inner().unwrap().finish().unwrap()
}

/// (file name, ELF bytes) of the three .NET libraries.
type Libs = Vec<(&'static str, Vec<u8>)>;

/// The three .NET libraries of `variant`.
fn native_libs(variant: &Variant) -> Libs {
    static BUILT: OnceLock<std::sync::Mutex<Vec<(String, Libs)>>> = OnceLock::new();
    let key = format!("{variant:?}");
    // Held while building: tests of one binary run in parallel and share the build dir.
    let mut cache = BUILT.get_or_init(Default::default).lock().unwrap_or_else(|p| p.into_inner());
    if let Some((_, libs)) = cache.iter().find(|(k, _)| *k == key) {
        return libs.clone();
    }
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("dotnet-stubs-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let stubs = dir.join("link");
    std::fs::create_dir_all(&stubs).unwrap();
    std::fs::write(dir.join("empty.c"), "int azp_stub_symbol;\n").unwrap();
    let cc = |args: &[&str]| {
        let out = Command::new("cc").args(args).current_dir(&dir).output().expect("cc (the tests need a C compiler)");
        assert!(out.status.success(), "cc {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    };
    // Link-time stand-ins with the sonames of the real libraries: the DT_NEEDED entries
    // are those sonames, whatever the host has installed.
    let mut sonames = vec![
        "libstdc++.so.6",
        "libpthread.so.0",
        "libdl.so.2",
        "libm.so.6",
        "libssl.so.3",
        "libcrypto.so.3",
        "libz.so.1",
    ];
    sonames.extend(variant.coreclr_needs);
    for so in &sonames {
        let soname = format!("-Wl,-soname,{so}");
        cc(&["-shared", "-fPIC", "-nostdlib", "-o", &format!("link/{so}"), &soname, "empty.c"]);
    }
    let libs: [(&'static str, Vec<&str>); 3] = [
        ("libcoreclr.so", {
            let mut v = vec!["libstdc++.so.6", "libpthread.so.0", "libdl.so.2", "libm.so.6"];
            v.extend(variant.coreclr_needs);
            v
        }),
        ("libSystem.Security.Cryptography.Native.OpenSsl.so", vec!["libssl.so.3", "libcrypto.so.3"]),
        ("libSystem.IO.Compression.Native.so", vec!["libz.so.1"]),
    ];
    let mut out = Vec::new();
    for (name, needed) in libs {
        let mut args = vec!["-shared".to_string(), "-fPIC".into(), "-o".into(), name.into(), "empty.c".into()];
        args.push("-Wl,--no-as-needed".into());
        args.push("-Llink".into());
        args.extend(needed.iter().map(|n| format!("-l:{n}")));
        cc(&args.iter().map(String::as_str).collect::<Vec<_>>());
        out.push((name, std::fs::read(dir.join(name)).unwrap()));
    }
    let _ = std::fs::remove_dir_all(&dir);
    cache.push((key, out.clone()));
    out
}

/// `debian-bookworm-agent` (rootfs-recipes/), built once with `rootfs build` (debootstrap
/// and apt against the Debian mirror, .debs cached in `fixtures/apt-cache`) and kept as a
/// zstd tarball. Needs root the first time.
pub fn agent_rootfs_tar() -> PathBuf {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| {
        let out = fixtures().join("debian-bookworm-agent.tar.zst");
        if out.exists() {
            return out;
        }
        let started = std::time::Instant::now();
        let home = fixtures().join("agent-rootfs-build");
        let _ = std::fs::remove_dir_all(&home);
        let cache = fixtures().join("apt-cache");
        let st = Command::new(bin())
            .arg("--home")
            .arg(&home)
            .args(["rootfs", "build"])
            .arg(repo().join("rootfs-recipes/debian-bookworm-agent.toml"))
            .arg("--cache-dir")
            .arg(&cache)
            .env_remove("AZP_SANDBOX_HOME")
            .status()
            .unwrap();
        assert!(st.success(), "rootfs build debian-bookworm-agent failed (see above)");
        let tree = home.join("rootfs/debian-bookworm-agent/tree");
        let partial = out.with_extension("partial");
        let st = Command::new("sh")
            .arg("-c")
            .arg("tar --numeric-owner --xattrs -C \"$1\" -cf - . | zstd -q -T0 -3 -o \"$2\"")
            .arg("sh")
            .arg(&tree)
            .arg(&partial)
            .status()
            .unwrap();
        assert!(st.success(), "cannot tar {}", tree.display());
        std::fs::rename(&partial, &out).unwrap();
        let _ = Command::new(bin()).arg("--home").arg(&home).args(["rootfs", "rm", "debian-bookworm-agent"]).status();
        let _ = std::fs::remove_dir_all(&home);
        eprintln!("built the debian-bookworm-agent fixture in {:.0} s", started.elapsed().as_secs_f64());
        out
    })
    .clone()
}

// --- the entry scripts (bash), written from the described behaviour ---

pub const CONFIG_SH: &str = r#"#!/bin/bash
# Stand-in for the Azure Pipelines agent's config.sh, written for the azp-sandbox tests
# from the behaviour described in shared/azure-agent-entrypoints.md.

if [ "$(id -u)" -eq 0 ] && [ -z "$AGENT_ALLOW_RUNASROOT" ]; then
    echo "Must not run with sudo"
    exit 1
fi

# The bundled .NET runtime's native dependencies.
if [ "$(uname)" = "Linux" ]; then
    if ! command -v ldd > /dev/null; then
        echo "Can not find 'ldd'. Please install 'ldd' and try again."
        exit 1
    fi
    for dotnet_lib in ./bin/libcoreclr.so ./bin/libSystem.Security.Cryptography.Native.OpenSsl.so ./bin/libSystem.IO.Compression.Native.so; do
        if ldd "$dotnet_lib" 2>&1 | grep -E 'not found|No such'; then
            echo "Dependencies missing for .NET 6.0"
            echo "Execute ./bin/installdependencies.sh to install any missing dependencies."
            exit 1
        fi
    done
    if [ -x "$(command -v ldconfig)" ]; then
        ldconfig_cmd=ldconfig
    else
        ldconfig_cmd=/sbin/ldconfig
        if [ ! -x "$ldconfig_cmd" ]; then
            echo "Can not find 'ldconfig' in PATH and '/sbin/ldconfig' doesn't exists either. Please install 'ldconfig' and try again."
            exit 1
        fi
    fi
    if ! "$ldconfig_cmd" -NXv ${LD_LIBRARY_PATH//:/ } 2>&1 | grep libicu > /dev/null 2>&1; then
        echo "libicu's dependencies missing for .NET 6"
        echo "Execute ./bin/installdependencies.sh to install any missing dependencies."
        exit 1
    fi
fi

cd "$(dirname "$0")" || exit 1
source ./env.sh

if [ "$1" = "remove" ]; then
    ./bin/Agent.Listener "$@"
else
    ./bin/Agent.Listener configure "$@"
fi
"#;

pub const RUN_SH: &str = r#"#!/bin/bash
# Stand-in for the Azure Pipelines agent's run.sh, written for the azp-sandbox tests from
# the behaviour described in shared/azure-agent-entrypoints.md: the listener runs as a
# child of this shell, with no exec and no trap, so a signal sent to this shell does not
# reach the listener.

if [ "$(id -u)" -eq 0 ] && [ -z "$AGENT_ALLOW_RUNASROOT" ]; then
    echo "Must not run interactively with sudo"
    exit 1
fi

# This script's own directory, through symlinks to it.
src="${BASH_SOURCE[0]}"
while [ -h "$src" ]; do
    dir="$(cd -P "$(dirname "$src")" && pwd)"
    src="$(readlink "$src")"
    [[ $src != /* ]] && src="$dir/$src"
done
DIR="$(cd -P "$(dirname "$src")" && pwd)"

"$DIR"/bin/Agent.Listener run "$@"
code=$?
if [ $code -eq 4 ]; then
    # A run-once agent received an update: the updater replaces bin/. Give it time, then
    # run the new listener once.
    echo "Agent update in progress, waiting for it to finish"
    sleep 5
    for i in $(seq 1 15); do
        if [ -x "$DIR"/bin/Agent.Listener ]; then
            "$DIR"/bin/Agent.Listener run "$@"
            exit $?
        fi
        sleep 1
    done
    echo "Failed to update within 20 seconds."
    exit 1
fi
exit $code
"#;

pub const ENV_SH: &str = r#"#!/bin/bash
# Stand-in for the agent's env.sh (sourced by config.sh in the agent's dir): PATH into
# .path, and into .env the well-known variables that are set and not in it yet.
[ -f .env ] || touch .env
for env_var in LANG JAVA_HOME ANT_HOME M2_HOME ANDROID_HOME GRADLE_HOME NVM_BIN NVM_PATH \
    VSTS_HTTP_PROXY VSTS_HTTP_PROXY_USERNAME VSTS_HTTP_PROXY_PASSWORD LD_LIBRARY_PATH PERL5LIB \
    AGENT_TOOLSDIRECTORY; do
    if [ -n "${!env_var}" ] && ! grep -q "^${env_var}=" .env; then
        echo "${env_var}=${!env_var}" >> .env
    fi
done
echo "$PATH" > .path
"#;

/// The stand-in listener. `#exit-code N` as a job's first line makes it exit N before the
/// job (a crash, or 4: an update), as the fake package's does.
pub const LISTENER: &str = r##"#!/bin/bash
# Stand-in for bin/Agent.Listener (a .NET program in the real package), for the
# azp-sandbox tests: configure | remove | run [--once] | --version, against the fake
# Azure DevOps (tests/common/fake_azure.rs), HTTP over bash's /dev/tcp.
AGENT_VERSION=@VERSION@
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root" || exit 2
cmd=${1:-}
[ $# -gt 0 ] && shift

now() { date -u '+%Y-%m-%d %H:%M:%SZ'; }
say() { echo "$(now): $*"; }
err() { echo "$*" >&2; }
# diag COMPONENT TEXT: a line of the _diag log of this run.
diag() { echo "[$(now) INFO $1] $2" >> "$diag_log"; }
new_diag_log() { mkdir -p _diag; diag_log="$root/_diag/$1_$(date -u +%Y%m%d-%H%M%S)-utc.log"; : >> "$diag_log"; }

json_num() { local re="\"$2\": *([0-9]+)"; [[ $1 =~ $re ]] && echo "${BASH_REMATCH[1]}"; }
json_str() { local re="\"$2\": *\"([^\"]*)\""; [[ $1 =~ $re ]] && echo "${BASH_REMATCH[1]}"; }
urlenc() { local s=${1//%/%25}; s=${s// /%20}; s=${s//&/%26}; s=${s//+/%2B}; s=${s//#/%23}; s=${s//\?/%3F}; s=${s//=/%3D}; printf '%s' "$s"; }

# set_server URL: host, port and path prefix of the organization URL (http only).
set_server() {
    base=${1%/}
    local rest=${base#http://}
    hostport=${rest%%/*}
    prefix=/${rest#*/}
    [ "$prefix" = "/$rest" ] && prefix=
    host=${hostport%:*}
    port=${hostport##*:}
    [ "$port" = "$hostport" ] && port=80
}

# http METHOD PATH AUTH [BODYFILE]: the answer's body on stdout; 0 for a 2xx answer.
http() {
    local method=$1 path=$2 auth=$3 body=${4:-} fd status line len=0
    [ -n "$body" ] && len=$(wc -c < "$body")
    exec {fd}<>"/dev/tcp/$host/$port" || return 1
    {
        printf '%s %s%s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n' "$method" "$prefix" "$path" "$hostport"
        printf 'Accept: application/json;api-version=7.1\r\nX-TFS-FedAuthRedirect: Suppress\r\n'
        [ -n "$auth" ] && printf 'Authorization: %s\r\n' "$auth"
        printf 'Content-Type: application/json\r\nContent-Length: %s\r\n\r\n' "$len"
        [ -n "$body" ] && cat "$body"
    } >&$fd
    IFS=' ' read -r _ status _ <&$fd
    while IFS= read -r line <&$fd; do [ -z "${line%$'\r'}" ] && break; done
    cat <&$fd
    exec {fd}>&-
    [[ $status == 2* ]]
}

# The environment as system capabilities (a JSON object), as the real agent builds them.
capabilities() {
    local name value out="{" sep=""
    while IFS= read -r name; do
        case "$name" in TERM|SHLVL|LS_COLORS|_|PWD|OLDPWD|VSTS_AGENT_INPUT_*) continue ;; esac
        [[ ",${VSO_AGENT_IGNORE}," == *",$name,"* ]] && continue
        [[ $name =~ ^[A-Za-z_][A-Za-z0-9_.]*$ ]] || continue
        value=${!name}
        [ ${#value} -ge 1024 ] && continue
        value=${value//\\/\\\\}; value=${value//\"/\\\"}
        value=${value//$'\n'/\\n}; value=${value//$'\r'/\\r}; value=${value//$'\t'/\\t}
        out+="$sep\"$name\":\"$value\""
        sep=","
    done < <(compgen -e)
    printf '%s%s"Agent.Name":"%s","Agent.Version":"%s","Agent.OS":"Linux"}' "$out" "$sep" "$1" "$AGENT_VERSION"
}

parse_args() {
    unattended=$VSTS_AGENT_INPUT_UNATTENDED replace=$VSTS_AGENT_INPUT_REPLACE
    url=$VSTS_AGENT_INPUT_URL auth=$VSTS_AGENT_INPUT_AUTH token=$VSTS_AGENT_INPUT_TOKEN
    pool=$VSTS_AGENT_INPUT_POOL agent=$VSTS_AGENT_INPUT_AGENT work=$VSTS_AGENT_INPUT_WORK
    while [ $# -gt 0 ]; do
        case "$1" in
            --unattended) unattended=true ;;
            --replace) replace=true ;;
            --acceptTeeEula|--acceptteeeula) ;;
            --url|--auth|--token|--pool|--agent|--work)
                [ $# -lt 2 ] && { err "error: missing value for $1"; exit 1; }
                case "$1" in
                    --url) url=$2 ;; --auth) auth=$2 ;; --token) token=$2 ;;
                    --pool) pool=$2 ;; --agent) agent=$2 ;; --work) work=$2 ;;
                esac
                shift ;;
            *) err "Unrecognized command-line input arguments: '$1'. For usage refer to: ./config.sh --help"; exit 1 ;;
        esac
        shift
    done
    # The agent drops its inputs from its own environment.
    for v in $(compgen -e VSTS_AGENT_INPUT_); do unset "$v"; done
    auth=${auth:-pat}
    [ "${auth,,}" = pat ] || { err "error: this stand-in supports --auth pat only"; exit 1; }
    [ -n "$token" ] || { err "error: no PAT: give --token or VSTS_AGENT_INPUT_TOKEN"; exit 1; }
    [ "$unattended" = true ] || { err "error: this stand-in runs --unattended only"; exit 1; }
    basic="Basic $(printf ':%s' "$token" | base64 -w0)"
    token=
}

read_settings() {
    local a c
    a=$(< .agent) c=$(< .credentials)
    set_server "$(json_str "$a" serverUrl)"
    name=$(json_str "$a" agentName) agentid=$(json_num "$a" agentId)
    poolid=$(json_num "$a" poolId) work=$(json_str "$a" workFolder)
    bearer="Bearer $(json_str "$c" clientId)"
}

configure() {
    if [ -f .agent ]; then
        err "Cannot configure the agent because it is already configured. To reconfigure the agent, run 'config.cmd remove' or './config.sh remove' first."
        exit 1
    fi
    parse_args "$@"
    [ -n "$url" ] || { err "error: no server URL: give --url"; exit 1; }
    pool=${pool:-default} agent=${agent:-$(hostname)} work=${work:-_work}
    set_server "$url"
    new_diag_log Agent
    diag AgentProcess "Agent package linux-x64, version $AGENT_VERSION; configure --url $base --pool $pool --agent $agent --auth pat --token ***"
    echo "Connecting to server ..."
    local pools existing body resp agentid clientid authurl
    pools=$(http GET "/_apis/distributedtask/pools?poolName=$(urlenc "$pool")" "$basic") \
        || { err "error: cannot connect to $base (or the PAT was rejected)"; exit 1; }
    poolid=$(json_num "$pools" id)
    [ -n "$poolid" ] || { err "error: agent pool not found: '$pool'"; exit 1; }
    existing=$(http GET "/_apis/distributedtask/pools/$poolid/agents?agentName=$(urlenc "$agent")" "$basic") \
        || { err "error: cannot list the agents of pool $pool"; exit 1; }
    agentid=$(json_num "$existing" id)
    body=$(mktemp) || exit 1
    printf '{"name":"%s","version":"%s","osDescription":"Linux (stand-in)","enabled":true,"maxParallelism":1,"provisioningState":"Provisioned","authorization":{"publicKey":{"exponent":"AQAB","modulus":"%s"}},"systemCapabilities":%s}' \
        "$agent" "$AGENT_VERSION" "$(head -c 48 /dev/urandom | base64 -w0)" "$(capabilities "$agent")" > "$body"
    if [ -n "$agentid" ]; then
        [ "$replace" = true ] || { rm -f "$body"; err "Pool $pool already contains an agent with name $agent."; exit 1; }
        echo "Found an existing agent with the same name: replacing it"
        resp=$(http PUT "/_apis/distributedtask/pools/$poolid/agents/$agentid" "$basic" "$body")
    else
        resp=$(http POST "/_apis/distributedtask/pools/$poolid/agents" "$basic" "$body")
    fi
    local rc=$?
    rm -f "$body"
    [ $rc -eq 0 ] || { err "error: the server refused to register agent $agent in pool $pool"; exit 1; }
    agentid=$(json_num "$resp" id) clientid=$(json_str "$resp" clientId) authurl=$(json_str "$resp" authorizationUrl)
    [ -n "$agentid" ] && [ -n "$clientid" ] || { err "error: the server's answer has no agent id or authorization"; exit 1; }
    umask 077
    printf '{\n  "agentId": %s,\n  "agentName": "%s",\n  "poolId": %s,\n  "poolName": "%s",\n  "serverUrl": "%s",\n  "workFolder": "%s"\n}\n' \
        "$agentid" "$agent" "$poolid" "$pool" "$base" "$work" > .agent
    printf '{\n  "scheme": "OAuth",\n  "data": {\n    "clientId": "%s",\n    "authorizationUrl": "%s",\n    "oauthEndpointUrl": "%s"\n  }\n}\n' \
        "$clientid" "$authurl" "$authurl" > .credentials
    head -c 64 /dev/urandom | base64 -w0 > .credentials_rsaparams
    umask 022
    chmod 644 .agent
    diag ConfigurationManager "Agent $agent (id $agentid) registered in pool $pool"
    echo "Successfully added the agent"
    echo "Settings Saved."
}

remove() {
    [ -f .agent ] || { err "error: the agent is not configured"; exit 1; }
    parse_args "$@"
    read_settings
    http DELETE "/_apis/distributedtask/pools/$poolid/agents/$agentid" "$basic" > /dev/null \
        || { err "error: cannot remove agent $name"; exit 1; }
    rm -f .agent .credentials .credentials_rsaparams
    echo "Removed .credentials"
    echo "Removed .agent"
}

# What a SIGINT or SIGTERM does: recorded here, acted on by the loops.
got_signal() {
    [ -n "$signal" ] && return
    signal=$1
    diag AgentProcess "Received SIG$1"
    say "Received SIG$1: shutting down"
}

# A signal the listener's first process kept for the loop (see `run)` below).
got_relayed_signal() {
    [ -z "$signal" ] && [ -s "$signal_file" ] && got_signal "$(< "$signal_file")"
}

delete_session() {
    http DELETE "/_fake/sessions?agent=$(urlenc "$name")" "$bearer" > /dev/null \
        || err "warning: could not delete the session"
}

# post_result ID QUERY FILE
post_result() {
    http POST "/_fake/jobs/$1/result?agent=$(urlenc "$name")&$2" "$bearer" "$3" > /dev/null
}

# cancel_steps PID: the steps' process group gets SIGINT, then SIGTERM, then SIGKILL;
# the job's shell itself while it has not made that group yet (just spawned, on a busy
# machine: giving up there left the job running to its end).
cancel_steps() {
    local pid=$1 sig t
    for sig in INT TERM KILL; do
        kill -s "$sig" -- "-$pid" 2> /dev/null || kill -s "$sig" "$pid" 2> /dev/null || break
        diag JobDispatcher "Job $job_id: sent SIG$sig to its steps"
        for t in $(seq 1 "${CANCEL_GRACE_TICKS:-30}"); do
            kill -0 "$pid" 2> /dev/null || break 2
            sleep 0.1
        done
    done
}

run_job() {
    job_id=$(json_num "$1" jobId)
    local script first code result out wpid
    script=$(printf '%s' "$(json_str "$1" scriptBase64)" | base64 -d)
    first=${script%%$'\n'*}
    case "$first" in
        "#exit-code "*)
            code=${first#"#exit-code "}
            say "Agent exits with code $code before job $job_id (test hook)"
            post_result "$job_id" "hook=$code" /dev/null
            exit "$code" ;;
    esac
    # Taken: the server shows it assigned, nothing shows on disk yet (a signal now
    # still cancels the job below, as the real listener does).
    if [ @DISPATCH_DELAY@ != 0 ]; then
        sleep @DISPATCH_DELAY@ &
        wait $!
    fi
    say "Running job: Job $job_id"
    local worker_log
    worker_log="$root/_diag/Worker_$(date -u +%Y%m%d-%H%M%S)-utc.log"
    echo "[$(now) INFO Worker] Job $job_id started" >> "$worker_log"
    mkdir -p "$work/1/s" "$work/_temp"
    out="$root/_diag/job-$job_id.out"
    (
        [ @STEPS_GROUP_DELAY@ != 0 ] && sleep @STEPS_GROUP_DELAY@
        cd "$work/1/s" || exit 1
        export AGENT_NAME="$name" AGENT_ID="$agentid" AGENT_HOMEDIRECTORY="$root" AGENT_WORKFOLDER="$root/$work"
        export BUILD_BUILDID="$job_id" SYSTEM_JOBID="$job_id" TF_BUILD=True BUILD_SOURCESDIRECTORY="$root/$work/1/s"
        exec setsid bash -c "$script"
    ) < /dev/null > "$out" 2>&1 &
    wpid=$!
    # A trapped SIGINT/SIGTERM ends the wait at once (its handler has run by then); one
    # that came before the wait began is seen here (else the wait would last the job).
    while :; do
        got_relayed_signal
        [ -n "$signal" ] && break
        wait "$wpid"
        code=$?
        [ -n "$signal" ] && break
        kill -0 "$wpid" 2> /dev/null || break
    done
    if [ -n "$signal" ]; then
        diag JobDispatcher "Job $job_id: cancelling (SIG$signal)"
        cancel_steps "$wpid"
        wait "$wpid" 2> /dev/null
        code=$?
        result=Canceled
    elif [ "$code" -eq 0 ]; then
        result=Succeeded
    else
        result=Failed
    fi
    echo "[$(now) INFO Worker] Job $job_id finished: $result" >> "$worker_log"
    local query="exitCode=$code&result=${result,,}"
    [ -n "$signal" ] && query+="&signal=$signal"
    post_result "$job_id" "$query" "$out" || err "warning: could not report job $job_id"
    rm -f "$out"
    diag JobDispatcher "Job $job_id completed with result: $result (exit code $code)"
    say "Job Job $job_id completed with result: $result"
}

run() {
    local once=false a job ticks=0 failures=0
    for a in "$@"; do [ "$a" = --once ] && once=true; done
    if [ ! -f .agent ] || [ ! -f .credentials ]; then
        err "An error occurred: Not configured. Run config.(sh/cmd) to configure the agent."
        exit 1
    fi
    read_settings
    if [ -f .env ]; then
        while IFS= read -r a; do case "$a" in *=*) export "$a" ;; esac; done < .env
    fi
    new_diag_log Agent
    signal=
    trap 'got_signal INT' INT
    trap 'got_signal TERM' TERM
    local caps
    caps=$(mktemp) || exit 1
    capabilities "$name" > "$caps"
    if ! http POST "/_fake/sessions?agent=$(urlenc "$name")" "$bearer" "$caps" > /dev/null; then
        rm -f "$caps"
        err "Failed to create session. The agent's credentials were rejected: configure it again."
        exit 1
    fi
    rm -f "$caps"
    diag MessageListener "Session created"
    say "Listening for Jobs"
    while :; do
        got_relayed_signal
        if [ -n "$signal" ]; then
            delete_session
            say "Exiting..."
            exit 0
        fi
        if job=$(http GET "/_fake/jobs/next?agent=$(urlenc "$name")" "$bearer"); then
            failures=0
            if [ -n "$job" ]; then
                run_job "$job"
                if [ -n "$signal" ] || $once; then
                    delete_session
                    say "Exiting..."
                    exit 0
                fi
            fi
        else
            failures=$((failures + 1))
            [ $failures -ge 5 ] && { err "error: lost the connection to $base"; exit 1; }
        fi
        sleep 0.2 &
        wait $!
        ticks=$((ticks + 1))
        if [ $ticks -ge $(( ${FAKE_AGENT_MAX_WAIT:-300} * 5 )) ]; then say "No job: exiting"; delete_session; exit 0; fi
    done
}

case "$cmd" in
    configure) configure "$@" ;;
    remove) remove "$@" ;;
    run)
        # A CI rehearsal's SIGINT, sent as the listener took its job, was never seen
        # (no "Received SIGINT", the job ran on); the real listener (.NET) sees every
        # one. Bash treats SIGINT apart from other signals: a SIGINT during `read -t`
        # runs no trap (seen with bash 5.2), and whether it acts on a SIGINT that came
        # while it waited for a foreground command depends on how that command ended
        # ("wait and cooperative exit"). Which path that run took is not known. So this
        # process only ever sits in the wait builtin (which runs a trap at once), keeps
        # the signal in a file and hands it to the listener's loop as SIGUSR1, which
        # bash handles as any trapped signal; the loop also looks at the file (a SIGUSR1
        # that came before its trap was set is ignored).
        signal_file=$(mktemp) || exit 1
        relay() {
            [ -s "$signal_file" ] || echo "$1" > "$signal_file"
            kill -USR1 "$loop" 2> /dev/null
        }
        trap '' USR1
        trap 'relay INT' INT
        trap 'relay TERM' TERM
        ( trap 'got_relayed_signal' USR1; run "$@" ) &
        loop=$!
        while :; do
            wait "$loop"
            code=$?
            kill -0 "$loop" 2> /dev/null || break
        done
        rm -f "$signal_file"
        exit "$code" ;;
    --version) echo "$AGENT_VERSION" ;;
    *) err "usage: Agent.Listener configure|remove|run [--once]|--version"; exit 2 ;;
esac
"##;
