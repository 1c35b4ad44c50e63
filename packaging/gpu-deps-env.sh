# shellcheck shell=bash
# Sourced by packaging/gpu-carry.sh and packaging/gpu-check.sh (bash): unpacks the carried Debian
# packages into a private prefix and points CMake, pkg-config, the linker and the loader at it, so
# a machine with no Debian packages (the GPU machine) builds TrainStudio's headless core + CUDA
# plugin without installing anything into /.
#
#   gpu_deps_unpack DEBDIR ROOT   dpkg -x every DEBDIR/*.deb into ROOT, then rewrite the absolute
#                                 /usr paths in their CMake configs and .pc files to ROOT/usr
#   gpu_deps_env ROOT             exports PATH, LD_LIBRARY_PATH, LIBRARY_PATH, PKG_CONFIG_PATH and
#                                 sets the array GPU_CMAKE_ARGS for the configure line

gpu_deps_unpack() {
  local debdir=$1 root=$2 f
  mkdir -p "$root"
  for f in "$debdir"/*.deb; do
    if command -v dpkg >/dev/null; then
      dpkg -x "$f" "$root"
    else
      # No dpkg (not a Debian-family image): a .deb is an ar archive holding data.tar.*.
      local tmp
      tmp=$(mktemp -d)
      (cd "$tmp" && ar x "$(readlink -f "$f")")
      tar -xf "$tmp"/data.tar.* -C "$root"
      rm -rf "$tmp"
    fi
  done
  # Debian's configs name /usr/include and /usr/lib/x86_64-linux-gnu literally in places
  # (imported targets' link lists, Gloo's include dirs, .pc prefixes); send those to ROOT.
  local files
  files=$(grep -rlE '(^|[" ;=(])/usr/(include|lib|bin|share)' \
            --include='*.cmake' --include='*.pc' "$root/usr" 2>/dev/null || true)
  if [[ -n "$files" ]]; then
    # shellcheck disable=SC2086
    sed -i -E "s#(^|[\" ;=(])/usr/(include|lib|bin|share)#\1$root/usr/\2#g" $files
  fi
  find "$root/usr" -name '*.pc' -exec sed -i -E "s#^prefix=/usr\$#prefix=$root/usr#" {} +
}

gpu_deps_env() {
  local root=$1
  local lib=$root/usr/lib/x86_64-linux-gnu
  export PATH="$root/usr/bin:$PATH"
  # Gloo installs into /usr/lib, everything else into the multiarch folder.
  export LD_LIBRARY_PATH="$lib:$root/usr/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export LIBRARY_PATH="$lib:$root/usr/lib${LIBRARY_PATH:+:$LIBRARY_PATH}"
  export PKG_CONFIG_PATH="$lib/pkgconfig:$root/usr/share/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
  local pkgconf=$root/usr/bin/pkgconf
  [[ -x $pkgconf ]] || pkgconf=$(command -v pkg-config || command -v pkgconf || echo pkg-config)
  # shellcheck disable=SC2034  # read by the scripts that source this file
  GPU_CMAKE_ARGS=(
    "-DCMAKE_PREFIX_PATH=$root/usr;$lib/cmake;$root/usr/share/cmake"
    "-DCMAKE_LIBRARY_PATH=$lib;$root/usr/lib"
    "-DCMAKE_INCLUDE_PATH=$root/usr/include;$root/usr/include/x86_64-linux-gnu"
    "-DCMAKE_PROGRAM_PATH=$root/usr/bin;$root/usr/lib/qt6/libexec"
    "-DPKG_CONFIG_EXECUTABLE=$pkgconf"
    # Indirect dependencies (libzip -> libssl, gRPC -> absl ...) resolve at link time from ROOT.
    "-DCMAKE_EXE_LINKER_FLAGS=-Wl,-rpath-link,$lib -Wl,-rpath-link,$root/usr/lib"
    "-DCMAKE_SHARED_LINKER_FLAGS=-Wl,-rpath-link,$lib -Wl,-rpath-link,$root/usr/lib"
    "-DCMAKE_MODULE_LINKER_FLAGS=-Wl,-rpath-link,$lib -Wl,-rpath-link,$root/usr/lib"
  )
}
