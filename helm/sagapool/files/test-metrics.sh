# Run by the chart's `helm test` pod: GET /readyz and /metrics from the
# metrics Service with bash's /dev/tcp (the image has no HTTP client).
# TARGET_HOST and TARGET_PORT name the Service; ATTEMPTS and PAUSE (seconds)
# bound the wait for a ready worker (default 30 x 2 s).
set -u
get() { # get PATH -> prints the response (status line, headers, body)
  exec 3<>"/dev/tcp/${TARGET_HOST}/${TARGET_PORT}" || return 1
  printf 'GET %s HTTP/1.0\r\nHost: %s\r\nConnection: close\r\n\r\n' "$1" "$TARGET_HOST" >&3
  timeout 10 cat <&3
  local rc=$?
  exec 3<&-
  return $rc
}
check() { # check PATH PATTERN: status 200 and PATTERN in the body, with retries
  local path=$1 pattern=$2 out status
  for _ in $(seq 1 "${ATTEMPTS:-30}"); do
    out=$(get "$path" 2>&1)
    status=$(printf '%s\n' "$out" | head -n 1 | tr -d '\r')
    if [[ $status == HTTP/1.?" 200"* ]] && grep -q -- "$pattern" <<<"$out"; then
      echo "ok: GET $path ($status)"
      return 0
    fi
    sleep "${PAUSE:-2}"
  done
  echo "FAILED: GET http://${TARGET_HOST}:${TARGET_PORT}$path: ${status:-no answer}; expected 200${pattern:+ and a line matching $pattern}" >&2
  return 1
}
check /readyz '' && check /metrics '^saga_build_info'
