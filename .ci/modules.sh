#!/usr/bin/env bash
# The dependency-family check: a library module may require only its own client library.
#
# For each library module it builds two throw-away programs outside the workspace: one that
# imports idem and the adapter, and one that imports idem and the adapter's client library
# directly. The adapter may add nothing to the module graph (`go list -m all`) but itself.
# The core module alone may bring only the standard library and testify's family.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export GOWORK=off GOFLAGS=-mod=mod

# modules DIR IMPORTS...: prints the module graph of a program importing the given packages.
modules() {
  local dir=$1; shift
  mkdir -p "$dir"
  {
    echo "package main"
    echo "import ("
    for p in "$@"; do echo "	_ \"$p\""; done
    echo ")"
    echo "func main() {}"
  } > "$dir/main.go"
  (
    cd "$dir"
    printf 'module example.com/check\n\ngo 1.26.0\n' > go.mod
    go mod edit -require=github.com/idemkit/idem@v0.0.0-00010101000000-000000000000 -replace=github.com/idemkit/idem="$root"
    for m in "${LOCAL[@]}"; do
      go mod edit -require="github.com/idemkit/idem/$m@v0.0.0-00010101000000-000000000000" -replace="github.com/idemkit/idem/$m=$root/$m"
    done
    for r in "${PIN[@]}"; do go mod edit -require="$r"; done
    go mod tidy >/dev/null 2>&1 || { go mod tidy; exit 1; }
    go list -m -f '{{.Path}}' all | sort
  )
}

fail=0
LOCAL=(); PIN=()
core=$(modules "$tmp/core" github.com/idemkit/idem)
extra=$(echo "$core" | grep -v -E '^(example.com/check|github.com/idemkit/idem|github.com/stretchr/testify|github.com/davecgh/go-spew|github.com/pmezard/go-difflib|github.com/stretchr/objx|gopkg.in/yaml.v3|go.yaml.in/yaml/v3|gopkg.in/check.v1)$' || true)
if [ -n "$extra" ]; then
  echo "modules: the core module brings more than the standard library and testify:" $extra >&2; fail=1
else
  echo "modules: core ok ($(echo "$core" | wc -l) modules in its graph: itself and testify's family)"
fi

# check MODULE CLIENT-MODULE... : the adapter MODULE may bring nothing beyond its client modules
# (each given as a module path; the program imports the module's root package).
check() {
  local mod=$1; shift
  local m
  PIN=()
  for m in "$@"; do PIN+=("$m@$(cd "$root/$mod" && go list -m -f '{{.Version}}' "$m")"); done
  local with without added
  LOCAL=("$mod")
  with=$(modules "$tmp/$mod-with" github.com/idemkit/idem "github.com/idemkit/idem/$mod")
  LOCAL=()
  without=$(modules "$tmp/$mod-without" github.com/idemkit/idem "${CLIENT_PKGS[@]}")
  added=$(comm -23 <(echo "$with") <(echo "$without") | grep -v -x "github.com/idemkit/idem/$mod" || true)
  if [ -n "$added" ]; then
    echo "modules: $mod brings modules beyond its client library ($*):" $added >&2
    fail=1
  else
    echo "modules: $mod ok ($(echo "$with" | wc -l) modules, all from idem's core and $*)"
  fi
}
CLIENT_PKGS=(github.com/jackc/pgx/v5 github.com/jackc/pgx/v5/pgxpool); check idempg github.com/jackc/pgx/v5
CLIENT_PKGS=(modernc.org/sqlite); check idemsqlite modernc.org/sqlite
CLIENT_PKGS=(github.com/go-sql-driver/mysql); check idemmysql github.com/go-sql-driver/mysql
CLIENT_PKGS=(github.com/nats-io/nats.go/jetstream); check idemnats github.com/nats-io/nats.go
CLIENT_PKGS=(github.com/rabbitmq/amqp091-go); check idemamqp github.com/rabbitmq/amqp091-go
CLIENT_PKGS=(github.com/redis/go-redis/v9); check idemredis github.com/redis/go-redis/v9
# kfake (franz-go's in-process cluster) is in the family: idemkafka's tests run against it.
CLIENT_PKGS=(github.com/twmb/franz-go/pkg/kgo github.com/twmb/franz-go/pkg/kfake); check idemkafka github.com/twmb/franz-go github.com/twmb/franz-go/pkg/kmsg github.com/twmb/franz-go/pkg/kfake
# pstest (the client library's in-process fake) is in the family: idempubsub's tests run against it.
CLIENT_PKGS=(cloud.google.com/go/pubsub/v2 cloud.google.com/go/pubsub/v2/apiv1/pubsubpb cloud.google.com/go/pubsub/v2/pstest); check idempubsub cloud.google.com/go/pubsub/v2
CLIENT_PKGS=(github.com/aws/aws-sdk-go-v2/service/sqs); check idemsqs github.com/aws/aws-sdk-go-v2/service/sqs github.com/aws/aws-sdk-go-v2 github.com/aws/smithy-go
CLIENT_PKGS=(github.com/prometheus/client_golang/prometheus); check idemprom github.com/prometheus/client_golang
# The SDK (in-memory exporters, the manual metric reader) is in the family: idemotel's tests run on it.
CLIENT_PKGS=(go.opentelemetry.io/otel go.opentelemetry.io/otel/sdk/trace go.opentelemetry.io/otel/sdk/trace/tracetest go.opentelemetry.io/otel/sdk/metric); check idemotel go.opentelemetry.io/otel go.opentelemetry.io/otel/sdk go.opentelemetry.io/otel/sdk/metric
CLIENT_PKGS=(github.com/santhosh-tekuri/jsonschema/v6 golang.org/x/text/message); check idemschema github.com/santhosh-tekuri/jsonschema/v6 golang.org/x/text
# The tools (cmd/idem, and cmd/idem/riverbench, the River side-by-side benchmark) are not
# libraries and are not checked above; but River, which only riverbench needs, may be required
# by no other module of the workspace.
for gomod in $(cd "$root" && git ls-files '*go.mod'); do
  case "$gomod" in cmd/idem/riverbench/go.mod) continue ;; esac
  if grep -q 'github.com/riverqueue/' "$root/$gomod"; then
    echo "modules: $gomod requires River, which only cmd/idem/riverbench may" >&2; fail=1
  fi
done
exit $fail
