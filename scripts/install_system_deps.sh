#!/usr/bin/env bash
# System libraries napari needs for a real OpenGL context under Xvfb on headless Debian/Ubuntu.
# QT_QPA_PLATFORM=offscreen alone gives napari no OpenGL context, so the GUI tests run on Xvfb.
set -euo pipefail
need=(xvfb xauth libgl1-mesa-dri libegl1 libgl1 libxkbcommon-x11-0 libxcb-icccm4 libxcb-image0
      libxcb-keysyms1 libxcb-randr0 libxcb-render-util0 libxcb-xinerama0 libxcb-xfixes0
      libxcb-shape0 libxcb-cursor0 libdbus-1-3 libfontconfig1)
missing=()
for pkg in "${need[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "ok installed" || missing+=("$pkg")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
if ! command -v apt-get >/dev/null; then
  echo "Install these system packages with your package manager: ${missing[*]}" >&2
  exit 1
fi
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
# another apt process (unattended upgrades, a parallel job) may hold the lock: wait for it
$SUDO apt-get -o DPkg::Lock::Timeout=600 update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "${missing[@]}"
