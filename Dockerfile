# One image for every dynoplan role: `dynoplan operator`, `dynoplan mocker serve`, `dynoplan frontend`,
# `dynoplan loadgen`, `dynoplan replay`. Runs as a non-root user and works with a read-only root
# filesystem (writes only to /tmp, mount an emptyDir there).
#   docker build -t dynoplan:latest .
FROM python:3.11-slim AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY mocker ./mocker
COPY planner ./planner
RUN python -m venv /opt/venv && /opt/venv/bin/pip install ".[planner,live,operator]"
COPY examples/profiles/make_mocker_profile.py /tmp/make_mocker_profile.py
RUN mkdir -p /opt/dynoplan/profiles \
 && /opt/venv/bin/python /tmp/make_mocker_profile.py /opt/dynoplan/profiles/mocker_vllm.npz

FROM python:3.11-slim
COPY --from=build /opt/venv /opt/venv
COPY --from=build /opt/dynoplan /opt/dynoplan
COPY examples/traces /opt/dynoplan/traces
ENV PATH=/opt/venv/bin:$PATH PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 HOME=/tmp MPLCONFIGDIR=/tmp
RUN groupadd --gid 10001 dynoplan && useradd --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin dynoplan
USER 10001:10001
WORKDIR /tmp
EXPOSE 8000 8080 9100
ENTRYPOINT ["dynoplan"]
CMD ["--help"]
