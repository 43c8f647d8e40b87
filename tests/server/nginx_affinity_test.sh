#!/usr/bin/env bash
# deploy/nginx/kiln.conf in front of two `kiln serve` replicas on loopback: every request
# of a session lands on the same replica (X-Kiln-Instance), later turns reuse the
# session's KV there (cached_tokens > 0), and sessions spread over both replicas.
# Exits 77 (CTest: skipped) without nginx. Usage: nginx_affinity_test.sh KILN FIXTURES SRC
set -euo pipefail
kiln=$1 fixtures=$2 src=$3
command -v nginx >/dev/null || { echo "nginx not installed; skipping"; exit 77; }
tmp=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  [ -f "$tmp/nginx.pid" ] && kill "$(cat "$tmp/nginx.pid")" 2>/dev/null || true
  wait 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT
read -r p0 p1 p2 < <(python3 -c 'import socket
s=[socket.socket() for _ in range(3)]
[x.bind(("127.0.0.1",0)) for x in s]
print(*[x.getsockname()[1] for x in s])')
for p in $p1 $p2; do
  "$kiln" serve -m llama="$fixtures/models/llama" --port "$p" --instance-name "replica-$p" 2>"$tmp/kiln-$p.log" &
  pids+=($!)
done
sed -e "s/127.0.0.1:8001/127.0.0.1:$p1/; s/127.0.0.1:8002/127.0.0.1:$p2/; s/listen 127.0.0.1:8000/listen 127.0.0.1:$p0/" \
  "$src/deploy/nginx/kiln.conf" >"$tmp/kiln.conf"
user_line=""
[ "$(id -u)" = 0 ] && user_line="user root;"
cat >"$tmp/nginx.conf" <<CONF
$user_line
worker_processes 1;
pid $tmp/nginx.pid;
error_log $tmp/error.log;
events { worker_connections 256; }
http {
  access_log off;
  client_body_temp_path $tmp/body; proxy_temp_path $tmp/proxy;
  fastcgi_temp_path $tmp/fcgi; uwsgi_temp_path $tmp/uwsgi; scgi_temp_path $tmp/scgi;
  include $tmp/kiln.conf;
}
CONF
nginx -p "$tmp" -c "$tmp/nginx.conf"
for i in $(seq 100); do
  ok=0
  for p in $p0 $p1 $p2; do curl -sf "http://127.0.0.1:$p/health/ready" >/dev/null && ok=$((ok + 1)); done
  [ $ok = 3 ] && break
  sleep 0.1
done
[ $ok = 3 ] || { echo "replicas or nginx did not come up"; cat "$tmp"/*.log; exit 1; }

declare -A seen
for s in $(seq 16); do
  first=""
  for turn in 1 2 3; do
    out=$(curl -sS -D "$tmp/h" -H "X-Session-Id: sess-$s" -H 'Content-Type: application/json' \
      "http://127.0.0.1:$p0/v1/completions" \
      -d "{\"model\":\"llama\",\"prompt\":[1,$s,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20],\"max_tokens\":4,\"temperature\":0}")
    inst=$(grep -i '^x-kiln-instance:' "$tmp/h" | tr -d '\r' | awk '{print $2}')
    cached=$(printf '%s' "$out" | python3 -c 'import json,sys; print(json.load(sys.stdin)["usage"]["prompt_tokens_details"]["cached_tokens"])')
    [ -n "$inst" ] || { echo "no X-Kiln-Instance header: $out"; exit 1; }
    if [ -z "$first" ]; then first=$inst; fi
    [ "$inst" = "$first" ] || { echo "session sess-$s moved from $first to $inst"; exit 1; }
    if [ $turn -gt 1 ] && [ "$cached" -lt 16 ]; then
      echo "session sess-$s turn $turn: cached_tokens $cached, expected the session's KV"; exit 1
    fi
  done
  seen[$first]=1
done
[ ${#seen[@]} = 2 ] || { echo "all sessions went to one replica: ${!seen[*]}"; exit 1; }
# Streaming passes through unbuffered and ends with [DONE].
curl -sN -H 'Content-Type: application/json' "http://127.0.0.1:$p0/v1/completions" \
  -d '{"model":"llama","prompt":[1,2,3],"max_tokens":3,"stream":true}' | grep -q '^data: \[DONE\]'
echo "nginx affinity: 16 sessions x 3 turns pinned, spread over ${!seen[*]}"
