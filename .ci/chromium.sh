#!/usr/bin/env bash
# Headless Chromium and its WebDriver for the web chat page's browser test (tests/serve/test_web_page.py).
# Installs both from Debian's packages when this machine lacks either; the test fails without them.
set -euo pipefail
if [ ! -x /usr/bin/chromium ] || [ ! -x /usr/bin/chromedriver ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver
fi
