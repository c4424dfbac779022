#!/bin/sh
# Builds the GPU test and benchmark binaries (CGO_ENABLED=0, so they run on any x86-64 Linux with
# glibc; the NVIDIA driver is opened at run time) into bin/gpu/, with ptxgen and run-all.sh.
# On the GPU machine, from the repository root:
#   sh bin/gpu/run-all.sh            # all tests, then all benchmarks
#   sh bin/gpu/run-all.sh -gen       # first regenerate every kernels/*.ptx with nvcc (into place)
#   TEST_TIMEOUT=5m sh bin/gpu/run-all.sh   # each package's tests at most 5 minutes (default 15)
# Carry bin/ to that machine (it is git-ignored).
set -eu
cd "$(dirname "$0")/.."
out=bin/gpu
rm -rf "$out"
mkdir -p "$out"
export CGO_ENABLED=0 GOOS=linux GOARCH=amd64

# Packages with GPU code: those that import the cuda package, and cuda itself.
pkgs=$(go list -e -f '{{.ImportPath}} {{join .Imports " "}} {{join .TestImports " "}}' ./... |
	awk '$1 ~ /\/cuda$/ || / github.com\/qpack-dev\/qpack\/cuda( |$)/ {print $1}')
for p in $pkgs; do
	dir=$(go list -f '{{.Dir}}' "$p")
	rel=${dir#"$PWD"/}
	name=$(echo "$rel" | tr / _)
	go test -c -ldflags="-s -w" -o "$out/$name.test" "$p" # stripped: the whole folder must travel to the GPU machine
	# go test -c writes nothing for a package without tests
	if [ -f "$out/$name.test" ]; then echo "$rel $name.test" >>"$out/packages.txt"; fi
done
go build -o "$out/ptxgen" ./cuda/ptxgen

cat >"$out/run-all.sh" <<'RUN'
#!/bin/sh
# Runs every GPU test binary in its package directory (as go test does), then the benchmarks.
root=$(cd "$(dirname "$0")/../.." && pwd)
bin=$root/bin/gpu
status=0
if [ "${1:-}" = "-gen" ]; then
	for cu in $(cd "$root" && ls */kernels/*.cu */*/kernels/*.cu 2>/dev/null); do
		echo "== ptxgen $cu"
		(cd "$root" && "$bin/ptxgen" "$cu") || status=1
	done
fi
# A test that hangs panics after TEST_TIMEOUT with every goroutine's stack (what waits on what).
while read -r dir test; do
	echo "== test $dir"
	(cd "$root/$dir" && "$bin/$test" -test.v -test.count=1 -test.timeout "${TEST_TIMEOUT:-15m}") || status=1
done <"$bin/packages.txt"
while read -r dir test; do
	echo "== bench $dir"
	(cd "$root/$dir" && "$bin/$test" -test.run '^$' -test.bench . -test.benchtime 1x) || status=1
done <"$bin/packages.txt"
exit $status
RUN
chmod +x "$out/run-all.sh" scripts/build-gpu-tests.sh
echo "built into $out:"; ls -l "$out"
