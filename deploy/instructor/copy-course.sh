#!/bin/bash
# docker-stacks start hook (before-notebook.d): the course in the instructor's home on first
# start (~/course/grading next to ~/course/labs, as in the repository); never overwritten.
if [ ! -e "${HOME}/course/grading" ]; then
  mkdir -p "${HOME}/course"
  cp -r /opt/labs/grading "${HOME}/course/grading"
  cp -r /opt/labs/labs "${HOME}/course/labs"
fi
