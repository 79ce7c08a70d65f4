#!/usr/bin/env bash
# Checks that every library folder is a layer whose includes only go down:
#   core < ops < tracer < scheduler < backend < engine < dsl < distributed
# A file may include its own folder ("x.h") and lower layers (<sheaf/layer/x.h>);
# nothing climbs out of a folder with "../". The build enforces the same for
# the .cpp files (each layer compiles against an include root of the layers
# below it); this also covers headers. Prints each violation; exit 1 if any.
set -euo pipefail
cd "$(dirname "$0")/.."
layers=(core ops tracer scheduler backend engine dsl distributed)
rank() { local i; for i in "${!layers[@]}"; do [ "${layers[$i]}" = "$1" ] && { echo "$i"; return; }; done; echo -1; }
bad=0
for layer in "${layers[@]}"; do
  mine=$(rank "$layer")
  while IFS= read -r file; do
    while IFS= read -r line; do
      inc=$(sed -E 's/^#include[[:space:]]+[<"]([^>"]+)[>"].*/\1/' <<<"$line")
      case $inc in
        ../*|*/../*) echo "$file: climbs out of its folder: $line"; bad=1 ;;
        sheaf/*)
          target=$(cut -d/ -f2 <<<"$inc")
          r=$(rank "$target")
          if [ "$r" -lt 0 ]; then echo "$file: includes a non-layer: $line"; bad=1
          elif [ "$r" -gt "$mine" ]; then echo "$file: upward include ($layer -> $target): $line"; bad=1; fi ;;
      esac
    done < <(grep -E '^#include[[:space:]]+[<"]' "$file")
  done < <(find "$layer" -name '*.h' -o -name '*.cpp' | sort)
done
# The public umbrella header: what a model author needs, no scheduler internals.
for inc in $(grep -E '^#include' sheaf.h | sed -E 's/^#include[[:space:]]+"([^"]+)".*/\1/'); do
  case $inc in
    dsl/*|engine/graph.h|engine/overlap.h|engine/prefetch.h|backend/runtime.h|scheduler/strategy.h|distributed/data_parallel.h) ;;
    *) echo "sheaf.h: exports an internal header: $inc"; bad=1 ;;
  esac
done
[ $bad -eq 0 ] && echo "layers: every include goes down (${layers[*]})"
exit $bad
