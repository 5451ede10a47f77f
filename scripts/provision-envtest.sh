#!/usr/bin/env bash
# Provision the Kubernetes 1.20.2 binaries and etcd for the cluster tests: kube-apiserver and
# kube-controller-manager for the envtest tier, kube-scheduler, kubelet and kube-proxy for the
# real-node tier (tests/support/node.py) and the scheduler placement tests.
#
# Idempotent:
#   1. If $KUBEBUILDER_ASSETS is set and holds kube-apiserver and etcd, nothing is done.
#   2. Else if the cache folder
#        ${TRAINJOB_ENVTEST_CACHE:-$HOME/.cache/trainjob-operator/envtest/1.20.2}
#      holds every binary in CACHED_BINARIES below, nothing is done.
#   3. Else the binaries are built from Debian bookworm's kubernetes source package (the recipe of
#      DESIGN.md, "Provisioning kube-apiserver and etcd here") and put in the cache folder.
#
# Building needs root (apt-get install) and the Debian package mirror the machine is already
# configured with; the mirror URL is read from the machine's apt configuration at run time
# (override with TRAINJOB_DEBIAN_MIRROR; the source version with TRAINJOB_ENVTEST_DEB_VERSION,
# and when that version is gone from the mirror, bookworm's current one is used). The machine's
# apt configuration is not changed: the deb-src entry lives in a source list of this script's
# own, with its own lists directory, in a temporary work folder that is removed afterwards (keep
# it with TRAINJOB_ENVTEST_KEEP_WORKDIR=1).
#
# The last line printed on stdout is the folder that holds the binaries.
set -euo pipefail

# Everything runs inside main(), so bash parses the whole file before running any of it (safe
# against the file being edited or replaced while a long build runs).
main() {

K8S_VERSION="1.20.2"
DEB_SOURCE_VERSION="${TRAINJOB_ENVTEST_DEB_VERSION:-1.20.5+really1.20.2-1.1+deb12u1}"
SUITE="bookworm"
CACHE_DIR="${TRAINJOB_ENVTEST_CACHE:-$HOME/.cache/trainjob-operator/envtest/${K8S_VERSION}}"
REFLECT2_SRC="/usr/share/gocode/src/github.com/modern-go/reflect2"
# gcc and libc6-dev: the kubelet is not a static binary (Kubernetes' build links it with cgo).
APT_PACKAGES=(etcd-server golang-go rsync golang-github-modern-go-reflect2-dev dpkg-dev gcc libc6-dev)
# What the cache folder must hold to count as provisioned (etcd is copied from Debian's package).
CACHED_BINARIES=(kube-apiserver etcd kube-controller-manager kube-scheduler kubelet kube-proxy)
BUILT_COMMANDS="cmd/kube-apiserver cmd/kube-controller-manager cmd/kube-scheduler cmd/kubelet cmd/kube-proxy"

log() { printf '[provision-envtest %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() {
    log "ERROR: $*"
    exit 1
}

has_assets() { # dir [require-every-cached-binary]
    local dir="$1" need_all="${2:-0}" name
    [[ -n "$dir" && -x "$dir/kube-apiserver" && -x "$dir/etcd" ]] || return 1
    [[ "$need_all" == 0 ]] && return 0
    for name in "${CACHED_BINARIES[@]}"; do
        [[ -x "$dir/$name" ]] || return 1
    done
}

if [[ -n "${KUBEBUILDER_ASSETS:-}" ]] && has_assets "$KUBEBUILDER_ASSETS"; then
    log "using KUBEBUILDER_ASSETS=$KUBEBUILDER_ASSETS"
    echo "$KUBEBUILDER_ASSETS"
    exit 0
fi
if has_assets "$CACHE_DIR" 1; then
    log "using cached binaries in $CACHE_DIR"
    echo "$CACHE_DIR"
    exit 0
fi

# One build at a time (parallel test sessions may call this script together).
mkdir -p "$(dirname "$CACHE_DIR")"
exec 9>"$CACHE_DIR.lock"
if command -v flock >/dev/null; then
    if ! flock -n 9; then
        log "another provisioning run holds $CACHE_DIR.lock; waiting for it"
        flock 9
    fi
    if has_assets "$CACHE_DIR" 1; then
        log "another run provisioned $CACHE_DIR"
        echo "$CACHE_DIR"
        exit 0
    fi
fi

[[ "$(id -u)" == 0 ]] || die "building the binaries needs root (apt-get install); run as root \
or set KUBEBUILDER_ASSETS to a folder with kube-apiserver and etcd"
command -v apt-get >/dev/null || die "apt-get not found: this recipe needs Debian bookworm"

started=$(date +%s)
workdir="$(mktemp -d "${TMPDIR:-/tmp}/trainjob-envtest.XXXXXX")"
cleanup() {
    local rc=$?
    if [[ $rc != 0 ]]; then
        log "FAILED with exit status $rc (re-run with TRAINJOB_ENVTEST_KEEP_WORKDIR=1 to keep $workdir)"
    fi
    if [[ "${TRAINJOB_ENVTEST_KEEP_WORKDIR:-0}" == 1 ]]; then
        log "keeping the work folder $workdir"
    else
        # Go's module/build caches are read-only files; make them removable first.
        chmod -R u+w "$workdir" 2>/dev/null || true
        rm -rf "$workdir"
    fi
}
trap cleanup EXIT
log "work folder: $workdir"

export DEBIAN_FRONTEND=noninteractive
log "apt-get update"
apt-get update -q >&2
log "apt-get install -y ${APT_PACKAGES[*]}"
apt-get install -y -q --no-install-recommends "${APT_PACKAGES[@]}" >&2

# --- the Debian mirror, from the machine's own apt configuration -------------------------------
find_mirror() {
    if [[ -n "${TRAINJOB_DEBIAN_MIRROR:-}" ]]; then
        echo "$TRAINJOB_DEBIAN_MIRROR"
        return
    fi
    local uri
    # apt's own view of the configured sources (handles deb822 .sources and one-line .list files).
    uri="$(apt-get indextargets --format '$(REPO_URI)|$(RELEASE)|$(CODENAME)|$(TARGET_OF)' \
        'Created-By: Packages' 2>/dev/null |
        awk -F'|' -v s="$SUITE" '$4 == "deb" && ($2 == s || $3 == s) { print $1; exit }')"
    if [[ -z "$uri" ]]; then
        # Fallback: read the source files directly.
        uri="$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null |
            awk -v s="$SUITE" '$1 == "deb" {
                    for (i = 2; i <= NF; i++) if ($i ~ /^[a-z+]+:\/\//) { u = $i; n = $(i + 1); break }
                    if (n == s) { print u; exit } }')"
    fi
    if [[ -z "$uri" ]]; then
        uri="$(awk -v s="$SUITE" '
                /^[[:space:]]*$/ { if (ok && u != "") { print u; exit } ok = 0; u = ""; next }
                tolower($1) == "uris:" { u = $2 }
                tolower($1) == "suites:" { for (i = 2; i <= NF; i++) if ($i == s) ok = 1 }
                END { if (ok && u != "") print u }' /etc/apt/sources.list.d/*.sources 2>/dev/null |
            sed -n 1p)"  # not head: SIGPIPE under pipefail
    fi
    echo "${uri%/}"
}
mirror="$(find_mirror)"
[[ -n "$mirror" ]] || die "no apt source for Debian $SUITE found in /etc/apt (set TRAINJOB_DEBIAN_MIRROR)"
log "Debian mirror (from the machine's apt configuration): $mirror"

# --- apt-get source, with a source list and lists folder of our own ---------------------------
aptdir="$workdir/apt"
mkdir -p "$aptdir/sources.list.d" "$aptdir/lists/partial" "$aptdir/cache/archives/partial"
signed_by=""
if [[ -r /usr/share/keyrings/debian-archive-keyring.gpg ]]; then
    signed_by="[signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] "
fi
echo "deb-src ${signed_by}${mirror} ${SUITE} main" >"$aptdir/sources.list"
apt_opts=(
    -o "Dir::Etc::SourceList=$aptdir/sources.list"
    -o "Dir::Etc::SourceParts=$aptdir/sources.list.d"
    -o "Dir::State::Lists=$aptdir/lists"
    -o "Dir::Cache=$aptdir/cache"
    -o "APT::Get::List-Cleanup=0"
    # The work folder is private to root (mktemp -d): download as root, not as _apt.
    -o "APT::Sandbox::User=root"
)
log "apt-get update (deb-src $SUITE only, private lists folder)"
apt-get "${apt_opts[@]}" update -q >&2
srcdir="$workdir/src"
mkdir -p "$srcdir"
log "apt-get source --download-only kubernetes=$DEB_SOURCE_VERSION"
if ! (cd "$srcdir" && apt-get "${apt_opts[@]}" source -q --download-only \
    "kubernetes=$DEB_SOURCE_VERSION") >&2; then
    # A later bookworm point release (+deb12uN) ships the same 1.20.2 orig tarball.
    log "version $DEB_SOURCE_VERSION not on the mirror; trying $SUITE's current kubernetes source"
    (cd "$srcdir" && apt-get "${apt_opts[@]}" source -q --download-only kubernetes) >&2
fi

shopt -s nullglob
origs=("$srcdir"/kubernetes_*.orig.tar.*)
shopt -u nullglob
[[ ${#origs[@]} -ge 1 ]] || die "no orig tarball downloaded: $(ls "$srcdir")"
[[ "${origs[0]##*/}" == *"$K8S_VERSION"* ]] || die "${origs[0]##*/} is not Kubernetes $K8S_VERSION"
log "unpacking ${origs[0]##*/}"
tree="$workdir/kubernetes"
mkdir -p "$tree"
tar -xf "${origs[0]}" -C "$tree" --strip-components=1
[[ -f "$tree/Makefile" && -d "$tree/vendor" ]] || die "unexpected layout of ${origs[0]##*/}"

# Go 1.19 crashes the vendored reflect2 1.0.1 (segfault in map iteration): use Debian's 1.0.2.
[[ -d "$REFLECT2_SRC" ]] || die "$REFLECT2_SRC missing (golang-github-modern-go-reflect2-dev)"
log "replacing vendor/github.com/modern-go/reflect2 with $REFLECT2_SRC"
rm -rf "$tree/vendor/github.com/modern-go/reflect2"
mkdir -p "$tree/vendor/github.com/modern-go/reflect2"
# Only the Go package files (no tests, no nested modules), as vendoring would copy them.
find "$REFLECT2_SRC" -maxdepth 1 -type f \( -name '*.go' -o -name '*.s' \) ! -name '*_test.go' \
    -exec cp {} "$tree/vendor/github.com/modern-go/reflect2/" \;
[[ -f "$REFLECT2_SRC/LICENSE" ]] && cp "$REFLECT2_SRC/LICENSE" "$tree/vendor/github.com/modern-go/reflect2/"

# No git metadata in the tarball: give the build its version explicitly (so /version says 1.20).
cat >"$workdir/version.env" <<EOF
KUBE_GIT_COMMIT='0000000000000000000000000000000000000000'
KUBE_GIT_TREE_STATE='clean'
KUBE_GIT_VERSION='v${K8S_VERSION}'
KUBE_GIT_MAJOR='${K8S_VERSION%%.*}'
KUBE_GIT_MINOR='$(echo "$K8S_VERSION" | cut -d. -f2)'
EOF

log "go version: $(go version)"
log "building $BUILT_COMMANDS (about 10 minutes on 2 cores)"
build_started=$(date +%s)
(
    cd "$tree"
    # No CGO_ENABLED here: Kubernetes' build makes the static binaries with cgo off itself and
    # links the kubelet with cgo, as upstream releases do.
    export GOPATH="$workdir/gopath" GOCACHE="$workdir/gocache"
    export GO111MODULE=off GOFLAGS="" GOPROXY=off GOTOOLCHAIN=local
    export KUBE_GIT_VERSION_FILE="$workdir/version.env"
    make WHAT="$BUILT_COMMANDS"
) >&2
log "build took $(($(date +%s) - build_started))s"

bindir=""
for d in "$tree/_output/local/bin/linux/$(go env GOARCH)" "$tree/_output/bin"; do
    if [[ -x "$d/kube-apiserver" ]]; then
        bindir="$d"
        break
    fi
done
[[ -n "$bindir" ]] || die "kube-apiserver not found under $tree/_output"
etcd_bin="$(command -v etcd || echo /usr/bin/etcd)"
[[ -x "$etcd_bin" ]] || die "etcd not found (etcd-server package)"

staging="$CACHE_DIR.new.$$"
rm -rf "$staging"
mkdir -p "$staging"
for name in "${CACHED_BINARIES[@]}"; do
    [[ "$name" == etcd ]] || cp "$bindir/$name" "$staging/"
done
# A copy, not a link: the cache keeps working if the etcd-server package is removed later.
cp "$etcd_bin" "$staging/etcd"
chmod 0755 "$staging"/*
"$staging/kube-apiserver" --version >&2
"$staging/etcd" --version | sed -n 1p >&2  # sed reads it all: head could end etcd with SIGPIPE (141) under pipefail
rm -rf "$CACHE_DIR"
mv "$staging" "$CACHE_DIR"
log "done in $(($(date +%s) - started))s; binaries in $CACHE_DIR"
echo "$CACHE_DIR"
}

main "$@"
