# One image for every dynoplan role: `dynoplan operator`, `dynoplan mocker serve`, `dynoplan frontend`,
# `dynoplan loadgen`, `dynoplan replay`. Runs as a non-root user and works with a read-only root
# filesystem (writes only to /tmp, mount an emptyDir there).
#   docker build -t dynoplan:latest .
# BASE: any Debian-like image with Python 3.11 and the venv module. The default is the official
# python:3.11-slim; tools/build-images.sh builds it with `buildah bud --build-arg BASE=...` from a
# local debootstrap'ed Debian bookworm (python3, python3-venv) where no registry is reachable.
ARG BASE=python:3.11-slim
FROM ${BASE} AS build
# DYNOPLAN_PURE_PYTHON: 1 (default) installs the simulator as Python source; 0 compiles its hot modules with
# mypyc (docs/architecture.md "Compiled modules"), which needs a C compiler and the Python headers in BASE
# (neither python:3.11-slim nor the debootstrap'ed base has gcc) and puts mypy into /opt/venv.
ARG DYNOPLAN_PURE_PYTHON=1
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 DYNOPLAN_PURE_PYTHON=${DYNOPLAN_PURE_PYTHON}
WORKDIR /src
# Dependencies first, from pyproject.toml alone, into /opt/venv; a source change reuses this layer (and,
# in the final stage, the copy of /opt/venv; README.md, which the project's metadata names, comes later so that
# a README edit does not reinstall the dependencies). The project itself (with setup.py, its build step) goes to
# /opt/app (found through a .pth).
COPY pyproject.toml ./
RUN python3 -m venv /opt/venv \
 && /opt/venv/bin/python -c "import os, tomllib; p = tomllib.load(open('pyproject.toml', 'rb')); \
b = p['build-system']['requires']; \
b = [r for r in b if r.startswith(('setuptools', 'wheel'))] if os.environ['DYNOPLAN_PURE_PYTHON'] == '1' else b; \
print('\n'.join(b + p['project']['dependencies'] \
+ [d for x in ('planner', 'live', 'operator') for d in p['project']['optional-dependencies'][x]]))" \
    > /tmp/requirements.txt \
 && /opt/venv/bin/pip install -r /tmp/requirements.txt \
 && /opt/venv/bin/python -c "import site, sys; open(site.getsitepackages()[0] + '/dynoplan-app.pth', 'w').write( \
'/opt/app/lib/python%d.%d/site-packages\n' % sys.version_info[:2])"
COPY README.md setup.py ./
COPY dynoplan ./dynoplan
COPY mocker ./mocker
COPY planner ./planner
RUN /opt/venv/bin/pip install --no-deps --no-build-isolation --prefix /opt/app . \
 && /opt/venv/bin/python -c "import dynoplan, mocker, planner.cli"
COPY examples/profiles/make_mocker_profile.py /tmp/make_mocker_profile.py
RUN mkdir -p /opt/dynoplan/profiles \
 && PATH=/opt/app/bin:/opt/venv/bin:$PATH /opt/venv/bin/python /tmp/make_mocker_profile.py /opt/dynoplan/profiles/mocker_vllm.npz

FROM ${BASE}
COPY --from=build /opt/venv /opt/venv
COPY --from=build /opt/app /opt/app
COPY --from=build /opt/dynoplan /opt/dynoplan
COPY examples/traces /opt/dynoplan/traces
ENV PATH=/opt/app/bin:/opt/venv/bin:$PATH PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 HOME=/tmp MPLCONFIGDIR=/tmp
RUN groupadd --gid 10001 dynoplan && useradd --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin dynoplan
USER 10001:10001
WORKDIR /tmp
EXPOSE 8000 8080 9100
ENTRYPOINT ["dynoplan"]
CMD ["--help"]
