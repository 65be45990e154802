# Uniform transfer requests for saga-producer --file (its own generator is
# always Zipf-skewed), one JSON line each: n requests between distinct
# accounts of acct-0 .. acct-(m-1), amounts 1..10000, seed 7, so every run
# of the bench sends the same ones.
#   awk -v n=N -v m=ACCOUNTS -f bench/uniform.awk >uniform.jsonl
BEGIN {
  srand(7)
  for (i = 0; i < n; i++) {
    a = int(rand() * m); b = int(rand() * (m - 1)); if (b >= a) b++
    printf "{\"id\": \"u-%d\", \"from\": \"acct-%d\", \"to\": \"acct-%d\", \"amount\": %d}\n", i, a, b, 1 + int(rand() * 10000)
  }
}
