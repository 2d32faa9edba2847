#!/usr/bin/env bash
# Start JupyterLab on the student notebooks (labs/). Used by `make lab`.
#   PORT=8899 make lab     a port of your choice (default: a free one picked by the OS)
#   IP=0.0.0.0 make lab    listen on all interfaces (remote machines; default 127.0.0.1)
#   NOTEBOOKS=dir make lab serve another folder (default: labs/)
# Ctrl-C stops the server at once (no confirmation prompt) and shuts its kernels down.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
VENV=${VENV:-$ROOT/.venv}
PORT=${PORT:-0}
IP=${IP:-127.0.0.1}
NOTEBOOKS=${NOTEBOOKS:-$ROOT/labs}
if ! [[ "$PORT" =~ ^[0-9]+$ ]] || { [ "$PORT" -ne 0 ] && { [ "$PORT" -lt 1024 ] || [ "$PORT" -gt 65535 ]; }; }; then
  printf 'lab: PORT=%s is not a usable port: give a number from 1024 to 65535, or leave PORT unset for a free one\n' "$PORT" >&2
  exit 2
fi
[ -d "$NOTEBOOKS" ] || { printf 'lab: NOTEBOOKS=%s is not a folder\n' "$NOTEBOOKS" >&2; exit 2; }
[ "${1:-}" = "--check-args" ] && exit 0
[ -x "$VENV/bin/jupyter" ] || { echo "lab: $VENV has no jupyter; run make setup" >&2; exit 1; }
echo "==> starting JupyterLab on $NOTEBOOKS (the URL with its token follows; Ctrl-C stops it)"
# port_retries=0: a port given explicitly is either free or an error, never silently another one.
# The instructor's formgrader is not part of a student's lab (validate and assignment list stay).
ROOT_FLAG=(); [ "$(id -u)" = 0 ] && ROOT_FLAG=(--allow-root)   # e.g. containers and CI run as root
exec "$VENV/bin/jupyter" lab --no-browser --ip="$IP" --port="$PORT" --ServerApp.port_retries=0 \
  --ServerApp.root_dir="$NOTEBOOKS" --ServerApp.answer_yes=True "${ROOT_FLAG[@]}" \
  --ServerApp.jpserver_extensions="{'nbgrader.server_extensions.formgrader': False, 'nbgrader.server_extensions.course_list': False}"
