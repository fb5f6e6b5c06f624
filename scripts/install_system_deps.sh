#!/usr/bin/env bash
# System libraries napari (PyQt6) needs for a real OpenGL context under Xvfb on headless
# Debian/Ubuntu. QT_QPA_PLATFORM=offscreen alone gives napari no OpenGL context, so the GUI
# tests run on Xvfb. Idempotent: exits at once when everything is installed.
set -euo pipefail
# "a|b": either package will do (Debian 12 names first, then the t64 names of Debian 13/Ubuntu 24.04)
need=(xvfb xauth libgl1-mesa-dri libegl1 libgl1 libxkbcommon-x11-0 libxcb-icccm4 libxcb-image0
      libxcb-keysyms1 libxcb-randr0 libxcb-render-util0 libxcb-xinerama0 libxcb-xfixes0
      libxcb-shape0 libxcb-cursor0 libdbus-1-3 libfontconfig1 "libglib2.0-0|libglib2.0-0t64")

installed() {
  dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "ok installed"
}

missing=()
for entry in "${need[@]}"; do
  IFS='|' read -r -a alternatives <<< "$entry"
  found=0
  for pkg in "${alternatives[@]}"; do
    if installed "$pkg"; then found=1; break; fi
  done
  [ "$found" -eq 1 ] || missing+=("$entry")
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
apt_get() {
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get -o DPkg::Lock::Timeout=600 "$@"
}
for attempt in 1 2 3; do  # the package-list lock is not covered by DPkg::Lock::Timeout everywhere
  apt_get update -qq && break
  [ "$attempt" -eq 3 ] && exit 1
  sleep 20
done
to_install=()
for entry in "${missing[@]}"; do
  IFS='|' read -r -a alternatives <<< "$entry"
  pick="${alternatives[0]}"
  for pkg in "${alternatives[@]}"; do  # the first name this release has a candidate for
    if apt-cache policy "$pkg" 2>/dev/null | grep -q "Candidate: [^(]"; then pick="$pkg"; break; fi
  done
  to_install+=("$pick")
done
apt_get install -y -qq --no-install-recommends "${to_install[@]}"
