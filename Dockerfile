# The engine as an image: the wheel built from this checkout, installed into a slim Python
# image, run as an unprivileged user. The same image runs every role:
#
#   docker build -t turnstile-engine:0.1.0 .
#   docker run --rm turnstile-engine:0.1.0 --version
#   docker run --rm -e TURNSTILE_BOOTSTRAP_SERVERS=kafka:9092 turnstile-engine:0.1.0 topics apply
#   docker run -v state:/state turnstile-engine:0.1.0 run processor --module myapp.workflows
#
# For your own workflows, build FROM this image and add your package:
#   FROM turnstile-engine:0.1.0
#   COPY --chown=turnstile:turnstile myapp/ /app/myapp/

# --- build: the wheel (schemas and topics spec inside it) ----------------------------------
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md LICENSE CHANGELOG.md ./
COPY engine/ engine/
COPY schemas/ schemas/
COPY topics/ topics/
RUN pip wheel --no-cache-dir --no-deps --disable-pip-version-check -w /dist .

# --- run: only the installed wheel and its dependencies -------------------------------------
FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    TURNSTILE_STATE_DIR=/state
COPY --from=build /dist/ /tmp/dist/
RUN pip install --no-cache-dir /tmp/dist/*.whl \
    && rm -rf /tmp/dist \
    && groupadd --system --gid 10001 turnstile \
    && useradd --system --uid 10001 --gid turnstile --home-dir /app --shell /usr/sbin/nologin turnstile \
    && mkdir -p /app /state \
    && chown turnstile:turnstile /app /state
WORKDIR /app
USER turnstile:turnstile
VOLUME ["/state"]
ENTRYPOINT ["turnstile"]
CMD ["--help"]
