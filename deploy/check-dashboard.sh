#!/usr/bin/env bash
# Static checks of the Grafana dashboard (make test-deploy):
#   - valid JSON with a uid, a title and unique panel ids;
#   - every panel has a title, a gridPos and the ${datasource} data source;
#   - every query has an expr and a refId, and names only metrics that
#     docs/metrics.md documents (histogram series by their _bucket/_sum/_count);
#   - every $variable an expr uses is defined in templating (or is Grafana's).
# Whether each expression returns data from a live plugin is checked by
# scripts/metrics/prometheus-e2e.sh.
#   deploy/check-dashboard.sh deploy/grafana/ncclnet-go.json [docs/metrics.md]
# The '$' and backquotes in single quotes below are literal on purpose.
# shellcheck disable=SC2016,SC2013
set -euo pipefail
dash=${1:?usage: $0 DASHBOARD.json [metrics.md]}
doc=${2:-$(dirname "$0")/../docs/metrics.md}
fail=0
bad() { echo "check-dashboard: FAIL: $*"; fail=1; }

jq -e . "$dash" >/dev/null || { echo "check-dashboard: FAIL: $dash is not valid JSON"; exit 1; }
[ -n "$(jq -r '.uid // empty' "$dash")" ] || bad "no uid"
[ -n "$(jq -r '.title // empty' "$dash")" ] || bad "no title"
dups=$(jq -r '[.panels[].id] | group_by(.) | map(select(length > 1)[0]) | .[]' "$dash")
[ -z "$dups" ] || bad "duplicate panel ids: $dups"
while IFS=$'\t' read -r id title ds grid; do
  [ -n "$title" ] || bad "panel $id has no title"
  [ "$ds" = '${datasource}' ] || bad "panel $id ($title) uses data source '$ds', not \${datasource}"
  [ "$grid" = true ] || bad "panel $id ($title) has no complete gridPos"
done < <(jq -r '.panels[] | [.id, .title, (.datasource.uid // ""), ((.gridPos | has("x") and has("y") and has("w") and has("h")) // false)] | @tsv' "$dash")
n=$(jq '[.panels[].targets[]?] | length' "$dash")
[ "$n" -gt 0 ] || bad "no queries"
while IFS=$'\t' read -r title ref expr; do
  [ -n "$ref" ] || bad "a query of panel '$title' has no refId"
  [ -n "$expr" ] || bad "a query of panel '$title' has no expr"
done < <(jq -r '.panels[] | .title as $t | .targets[]? | [$t, (.refId // ""), (.expr // "")] | @tsv' "$dash")

# Metric names documented in the reference table.
mapfile -t known < <(grep -o '^| `ncclnet_[a-z_]*`' "$doc" | tr -d '|` ')
[ "${#known[@]}" -gt 5 ] || bad "found no metric table in $doc"
is_known() {
  local m=$1 k
  for k in "${known[@]}"; do
    case "$m" in "$k" | "${k}_bucket" | "${k}_sum" | "${k}_count") return 0 ;; esac
  done
  return 1
}
vars=" $(jq -r '[.templating.list[].name] | join(" ")' "$dash") __rate_interval __interval __range "
while IFS= read -r expr; do
  for m in $(grep -o 'ncclnet_[a-z_]*' <<<"$expr" | sort -u); do
    is_known "$m" || bad "expression uses $m, which $doc does not document: $expr"
  done
  for v in $(grep -o '\$[a-z_]*' <<<"$expr" | tr -d '$' | sort -u); do
    [[ "$vars" == *" $v "* ]] || bad "expression uses \$$v, which is not a dashboard variable: $expr"
  done
done < <(jq -r '.. | objects | select(has("expr")) | .expr' "$dash"; jq -r '.templating.list[] | select(.type == "query") | (.query.query // .query)' "$dash")
[ "$fail" = 0 ] && echo "check-dashboard: $dash: $(jq '.panels | length' "$dash") panels, $n queries: ok"
exit "$fail"
