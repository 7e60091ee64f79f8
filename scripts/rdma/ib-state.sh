#!/usr/bin/env bash
# Prints whether the default plugin can run the ib transport: "absent" (no ./ib
# package yet), "unlinked" (./ib exists but cmd/libnccl-net-go does not import it,
# so NCCL_GO_TRANSPORT=ib would be refused) or "linked". The lane uses it to say
# clearly why the conformance run over rxe0 did not exercise ib.
set -euo pipefail
GO=${GO:-go}
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
if [ ! -d ib ] || [ -z "$(find ib -name '*.go' -print -quit)" ]; then
  echo absent; exit 0
fi
mod=$($GO list -m)
if $GO list -deps ./cmd/libnccl-net-go 2>/dev/null | grep -E "^$mod/ib(/|$)" >/dev/null; then
  echo linked
else
  echo unlinked
fi
