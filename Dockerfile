# One image for every role: gateway (`ballast`), simulator (`ballast-upstream`)
# and load generator (`ballast-load`). The build steps are the README's:
# python:3.11-slim, then `pip install .` from a checkout.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app
# Only what the package needs (no .venv, .git or run data in the build context copy).
COPY pyproject.toml README.md ./
COPY ballast_asgi ./ballast_asgi
COPY ballast_tools ./ballast_tools
RUN pip install --no-cache-dir .

# Unprivileged at run time.
RUN useradd --create-home --uid 10001 ballast
USER ballast

EXPOSE 8080 8081 9101 9102
CMD ["ballast", "--host", "0.0.0.0", "--port", "8080", "--admin-port", "8081"]
