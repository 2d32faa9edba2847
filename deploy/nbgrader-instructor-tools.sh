#!/bin/bash
# nbgrader's instructor tools (formgrader, course list, create assignment) off or on in this
# environment: the student image disables them (locked: not re-enabled from JupyterLab's plugin
# manager), the instructor image enables them.
#   bash deploy/nbgrader-instructor-tools.sh disable|enable      (SCOPE=user: in ~/.jupyter only)
set -euo pipefail
case "${1:-}" in
  disable) state=false; lab=(disable lock) ;;
  enable) state=true; lab=(unlock enable) ;;
  *) echo "usage: $0 disable|enable" >&2; exit 2 ;;
esac
case "${SCOPE:-sys-prefix}" in
  sys-prefix) level=sys_prefix; dir=$(python -c 'import sys; print(sys.prefix)')/etc/jupyter ;;
  user) level=user; dir=$(jupyter --config-dir) ;;
  *) echo "$0: SCOPE must be sys-prefix or user, got ${SCOPE}" >&2; exit 2 ;;
esac
plugins=(nbgrader:formgrader nbgrader:open-formgrader nbgrader:open-formgrader-local nbgrader:course-list
         nbgrader:open-course-list nbgrader:create-assignment nbgrader:open-create-assignment)
for step in "${lab[@]}"; do
  jupyter labextension "$step" --level="$level" "${plugins[@]}"
done
# The server side: nbgrader 0.9's modules fail `jupyter server extension disable`'s validation, so
# the switch is written where Jupyter reads it, after nbgrader's own file (names sort "zz" last).
mkdir -p "$dir/jupyter_server_config.d"
printf '{"ServerApp": {"jpserver_extensions": {"nbgrader.server_extensions.formgrader": %s, "nbgrader.server_extensions.course_list": %s}}}\n' \
  "$state" "$state" >"$dir/jupyter_server_config.d/zz-labs-nbgrader-instructor-tools.json"
