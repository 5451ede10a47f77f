#!/usr/bin/env bash
# Provision the host side of the real-node test tier (tests/support/node.py, tests/cluster/):
# everything a single-node Kubernetes 1.20 cluster on containerd needs besides the Kubernetes
# binaries themselves (scripts/provision-envtest.sh builds those).
#
#   1. Debian packages: containerd, runc, containernetworking-plugins, iptables, conntrack,
#      socat, dnsmasq-base (the DNS stand-in), debootstrap, buildah, podman, skopeo.
#   2. kubectl 1.20.2, extracted from Debian's kubernetes-client .deb (not installed: another
#      package may own /usr/bin/kubectl) into $CACHE/bin/kubectl.
#   3. The pod sandbox image localhost/trainjob-pause:<tag>: scripts/node/pause.c built with
#      `gcc -static` and committed with `buildah from scratch`.
#   4. The base image localhost/trainjob-base:bookworm: `debootstrap --variant=minbase bookworm`
#      with python3 (+ venv, python-is-python3), imported as one layer. The repository's
#      Dockerfile builds on it with BASE_IMAGE (scripts/build-images.sh).
#
# Both images are kept as docker-archive files in $CACHE/images/ (what the node's containerd
# imports) and loaded into podman's storage when missing there.
#
# Idempotent: each step is skipped when its result is already in
#   ${TRAINJOB_NODE_CACHE:-$HOME/.cache/trainjob-operator/node}
# (the images are rebuilt when scripts/node/pause.c or the base recipe changes). Needs root for
# apt-get and debootstrap; the Debian mirror comes from the machine's apt configuration
# (override with TRAINJOB_DEBIAN_MIRROR). The last line printed on stdout is the cache folder.
set -euo pipefail

main() {

SUITE="bookworm"
K8S_VERSION="1.20.2"
KUBECTL_DEB_VERSION="${TRAINJOB_KUBECTL_DEB_VERSION:-1.20.5+really1.20.2-1.1+deb12u1}"
CACHE_DIR="${TRAINJOB_NODE_CACHE:-$HOME/.cache/trainjob-operator/node}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PAUSE_SRC="$HERE/node/pause.c"
APT_PACKAGES=(containerd runc containernetworking-plugins iptables conntrack socat dnsmasq-base
    debootstrap buildah podman skopeo gcc libc6-dev)
# What the base image gets on top of minbase: the Dockerfile runs `python -m venv` and
# `groupadd`/`useradd` (passwd is in minbase). python3, not python3-minimal (no http module).
BASE_PACKAGES="python3,python3-venv,python-is-python3"
BASE_RECIPE="debootstrap --variant=minbase --include=$BASE_PACKAGES $SUITE (v1)"
BASE_IMAGE="localhost/trainjob-base:$SUITE"
PAUSE_REPO="localhost/trainjob-pause"

log() { printf '[provision-node %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() {
    log "ERROR: $*"
    exit 1
}

mkdir -p "$CACHE_DIR/bin" "$CACHE_DIR/images"
# One provisioning run at a time (parallel test sessions may call this script together).
exec 9>"$CACHE_DIR/.provision.lock"
if command -v flock >/dev/null && ! flock -n 9; then
    log "another provisioning run holds $CACHE_DIR/.provision.lock; waiting for it"
    flock 9
fi
started=$(date +%s)

# --- 1. Debian packages -------------------------------------------------------------------
missing=()
for pkg in "${APT_PACKAGES[@]}"; do
    if [[ "$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null)" != "install ok installed" ]]; then
        missing+=("$pkg")
    fi
done
if [[ ${#missing[@]} -gt 0 ]]; then
    [[ "$(id -u)" == 0 ]] || die "missing packages (${missing[*]}): run as root"
    command -v apt-get >/dev/null || die "apt-get not found: this recipe needs Debian $SUITE"
    export DEBIAN_FRONTEND=noninteractive
    log "apt-get install ${missing[*]}"
    apt-get update -q >&2
    apt-get install -y -q --no-install-recommends "${missing[@]}" >&2
fi

# --- 2. kubectl 1.20 ---------------------------------------------------------------------------
kubectl="$CACHE_DIR/bin/kubectl"
if ! "$kubectl" version --client --short 2>/dev/null | grep -q "v$K8S_VERSION"; then
    work="$(mktemp -d)"
    log "kubectl: apt-get download kubernetes-client=$KUBECTL_DEB_VERSION"
    if ! (cd "$work" && apt-get download -q "kubernetes-client=$KUBECTL_DEB_VERSION") >&2; then
        log "kubernetes-client $KUBECTL_DEB_VERSION not on the mirror; taking $SUITE's current one"
        (cd "$work" && apt-get download -q kubernetes-client) >&2
    fi
    dpkg-deb -x "$work"/kubernetes-client_*.deb "$work/root"
    install -m 0755 "$work/root/usr/bin/kubectl" "$kubectl.new"
    mv "$kubectl.new" "$kubectl"
    rm -rf "$work"
    "$kubectl" version --client --short >&2 || true
fi

# Is `name` in podman's storage with the cached archive's image ID? Else load the archive.
ensure_loaded() { # image archive
    local image="$1" archive="$2"
    if podman image exists "$image"; then
        return 0
    fi
    log "podman load < ${archive##*/}"
    podman load -q -i "$archive" >&2
    podman image exists "$image" || die "$archive did not hold $image"
}

# --- 3. The pause image ------------------------------------------------------------------------
[[ -f "$PAUSE_SRC" ]] || die "$PAUSE_SRC missing"
pause_tag="$(sha256sum "$PAUSE_SRC" | cut -c1-12)"
pause_image="$PAUSE_REPO:$pause_tag"
pause_tar="$CACHE_DIR/images/pause-$pause_tag.tar"
if [[ ! -s "$pause_tar" ]]; then
    work="$(mktemp -d)"
    log "pause image: gcc -static ${PAUSE_SRC#"$HERE"/}"
    gcc -static -O2 -Wall -o "$work/pause" "$PAUSE_SRC" >&2
    strip "$work/pause" 2>/dev/null || true
    ctr="$(buildah from --quiet scratch)"
    buildah copy --quiet "$ctr" "$work/pause" /pause >/dev/null
    buildah config --entrypoint '["/pause"]' --user 65535:65535 "$ctr" >/dev/null
    buildah commit --quiet --rm "$ctr" "$pause_image" >/dev/null
    rm -f "$pause_tar.new"
    podman save -q --format docker-archive -o "$pause_tar.new" "$pause_image"
    mv "$pause_tar.new" "$pause_tar"
    rm -rf "$work"
fi
ensure_loaded "$pause_image" "$pause_tar"
echo "$pause_image" >"$CACHE_DIR/images/pause.name"

# --- 4. The base image -------------------------------------------------------------------------
base_tag="$(printf '%s' "$BASE_RECIPE" | sha256sum | cut -c1-12)"
base_tar="$CACHE_DIR/images/base-$SUITE-$base_tag.tar"
if [[ ! -s "$base_tar" ]]; then
    [[ "$(id -u)" == 0 ]] || die "debootstrap needs root"
    mirror="$(find_mirror)"
    [[ -n "$mirror" ]] || die "no apt source for Debian $SUITE in /etc/apt (set TRAINJOB_DEBIAN_MIRROR)"
    work="$(mktemp -d)"
    log "base image: $BASE_RECIPE from $mirror (about a minute)"
    debootstrap --variant=minbase --include="$BASE_PACKAGES" "$SUITE" "$work/rootfs" "$mirror" \
        >"$work/debootstrap.log" 2>&1 || {
        tail -n 30 "$work/debootstrap.log" >&2
        die "debootstrap failed"
    }
    # No package caches, lists or logs in the image.
    rm -rf "$work/rootfs"/var/cache/apt/archives/*.deb "$work/rootfs"/var/lib/apt/lists/* \
        "$work/rootfs"/var/log/* "$work/rootfs"/tmp/*
    podman rmi -f "$BASE_IMAGE" >/dev/null 2>&1 || true
    tar -C "$work/rootfs" --numeric-owner -c . |
        podman import -q --change 'CMD ["/bin/bash"]' --change 'ENV LANG=C.UTF-8' \
            --message "$BASE_RECIPE" - "$BASE_IMAGE" >/dev/null
    rm -f "$base_tar.new"
    podman save -q --format docker-archive -o "$base_tar.new" "$BASE_IMAGE"
    mv "$base_tar.new" "$base_tar"
    rm -rf "$work"
    # Older base archives are of no further use.
    find "$CACHE_DIR/images" -maxdepth 1 -name "base-$SUITE-*.tar" ! -name "${base_tar##*/}" -delete
fi
ensure_loaded "$BASE_IMAGE" "$base_tar"
echo "$BASE_IMAGE" >"$CACHE_DIR/images/base.name"

log "host side ready in $(($(date +%s) - started))s: $CACHE_DIR"
echo "$CACHE_DIR"
}

# The Debian mirror of the machine's own apt configuration (as scripts/provision-envtest.sh).
find_mirror() {
    if [[ -n "${TRAINJOB_DEBIAN_MIRROR:-}" ]]; then
        echo "$TRAINJOB_DEBIAN_MIRROR"
        return
    fi
    local uri
    uri="$(apt-get indextargets --format '$(REPO_URI)|$(RELEASE)|$(CODENAME)|$(TARGET_OF)' \
        'Created-By: Packages' 2>/dev/null |
        awk -F'|' -v s="$SUITE" '$4 == "deb" && ($2 == s || $3 == s) { print $1; exit }')"
    echo "${uri%/}"
}

main "$@"
