# patches of helper branches against main's HEAD (results excluded) + their requests into .wt/: bash .probe/snap3.sh name...
cd /work/main && rm -rf .wt && mkdir -p .wt
for name in "$@"; do
  git diff --binary HEAD...h/s37-$name -- . ':!benchmarks/results' > .wt/$name.patch
  cp /work/gpu_requests/$name.sh .wt/$name.request.sh
  echo "$name $(git log --oneline -1 h/s37-$name | cut -c1-80) patch $(wc -c < .wt/$name.patch)"
done
du -sh .wt
