# One image for every kubegpu role: node agent (device-plugin, exporter, labels), scheduler
# extender and the tools. The role is the first argument: `kubegpu device-plugin ...`.
#
# Build from the repository root:   docker build -t kubegpu:0.1.0 .
# Runtime dependencies are pinned by deploy/image/constraints.txt (regenerate it with
# deploy/image/lock_runtime_deps.py). The base is pinned by version; pin it by digest too
# (python:3.11.13-slim-bookworm@sha256:...) when you mirror it into your registry.

ARG PYTHON_IMAGE=python:3.11.13-slim-bookworm

# --- build: a wheel of kubegpu and a virtualenv holding it and its pinned dependencies ------
FROM ${PYTHON_IMAGE} AS build

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1

WORKDIR /src
COPY deploy/image/constraints.txt /src/constraints.txt
# The build backend is pinned too, so the wheel is built the same way every time.
RUN python -m venv /opt/kubegpu \
    && /opt/kubegpu/bin/pip install pip==25.2 setuptools==80.9.0 wheel==0.45.1

# The pinned dependencies first, in their own layer, so a source change does not reinstall them.
RUN /opt/kubegpu/bin/pip install --requirement /src/constraints.txt

COPY pyproject.toml README.md /src/
COPY src /src/src
# --no-build-isolation: build with the pinned setuptools above instead of whatever is newest.
# Installing with -c holds every dependency to its pin; `pip check` fails the build if the
# constraints no longer satisfy pyproject.toml.
RUN /opt/kubegpu/bin/pip wheel --no-deps --no-build-isolation --wheel-dir /wheels /src \
    && /opt/kubegpu/bin/pip install --constraint /src/constraints.txt /wheels/kubegpu-*.whl \
    && /opt/kubegpu/bin/pip uninstall --yes setuptools wheel \
    && /opt/kubegpu/bin/pip check \
    && /opt/kubegpu/bin/kubegpu --version

# --- runtime: the interpreter, the virtualenv, an unprivileged user -------------------------
FROM ${PYTHON_IMAGE}

LABEL org.opencontainers.image.title="kubegpu" \
      org.opencontainers.image.description="GPUs as a first-class, shareable, observable Kubernetes resource" \
      org.opencontainers.image.licenses="Apache-2.0"

# A fixed numeric uid/gid so `runAsNonRoot` can verify it and volumes can be chowned to it.
RUN groupadd --system --gid 65532 kubegpu \
    && useradd --system --uid 65532 --gid 65532 --no-create-home --shell /usr/sbin/nologin kubegpu

COPY --from=build /opt/kubegpu /opt/kubegpu

# MPLCONFIGDIR: matplotlib (`kubegpu simulate`) must not try to write under a read-only $HOME.
ENV PATH=/opt/kubegpu/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    MPLCONFIGDIR=/tmp/matplotlib

# Non-root by default: the extender, the labeller and the tools need no privilege. The node
# agent's DaemonSet overrides this with runAsUser: 0 (see docs/install.md for why).
USER 65532:65532
WORKDIR /tmp

ENTRYPOINT ["kubegpu"]
CMD ["--help"]
