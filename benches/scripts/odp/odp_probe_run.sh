#!/bin/bash
echo "### uname -r: $(uname -r)"
for m in pin odp; do echo; echo "### /tmp/odpapt/c/odp_probe $m"; timeout 120 /tmp/odpapt/c/odp_probe $m; echo "### rc $?"; done
