#!/usr/bin/env bash
# Install headless Chromium (Debian packages chromium and chromium-driver) for the HTML report's
# browser test. Idempotent: does nothing when /usr/bin/chromium is already there.
set -euo pipefail
if [ -x /usr/bin/chromium ]; then
    echo "chromium already installed: $(/usr/bin/chromium --version 2>/dev/null || echo /usr/bin/chromium)"
    exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    SUDO="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends chromium chromium-driver fonts-dejavu-core >/dev/null
echo "installed: $(/usr/bin/chromium --version 2>/dev/null || echo /usr/bin/chromium)"
