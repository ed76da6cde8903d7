# taskq image: the CLI (`taskq`) as the entrypoint, for trainers, the reaper and the exporter.
#
# PID 1 is tini, which forwards SIGTERM to `taskq` and reaps zombies (a trainer's
# per-task subprocesses from `taskq work`). ENTRYPOINT is exec form so no shell sits
# between tini and Python swallowing the signal: a trainer scaled down gets SIGTERM,
# releases its leases in one call and exits within the grace period.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

RUN apt-get update \
    && apt-get install -y --no-install-recommends tini \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY taskq ./taskq
COPY cli ./cli
# the distribution taskq-ml from this checkout (PyPI's `taskq` is an unrelated project);
# a trainer image adds the extras it reads with: pip install '.[data,torch]'
RUN pip install . \
    && rm -rf /src/build

# The compose and Kubernetes demos: a 2,000-line data set and a stand-in training step.
COPY deploy/compose/demo-lines.txt deploy/compose/demo_step.py /opt/taskq-demo/

RUN useradd --create-home --uid 10001 --shell /usr/sbin/nologin taskq
USER 10001:10001
WORKDIR /home/taskq

ENV TASKQ_REDIS_URL=redis://redis:6379/0
# The exporter's port (`taskq exporter --port 9478`).
EXPOSE 9478

ENTRYPOINT ["/usr/bin/tini", "--", "taskq"]
CMD ["--help"]
