# eagle, final call (h/s34-eagle, worktree /work/wt/eagle, committed HEAD): 1 GPU, about 2.5 minutes.
# Run 2 (13:41): fixed vs "fixed, read back per head step" 445 vs 451 tok/s (propose 917 vs 1032 ms): chaining the
# drafts on the device is not what slowed run 1's fixed row. But the A/B's plain arm paid graph captures in its
# timed runs (plain 910 tok/s, ITL p99 50 ms): ratios unusable. `captures` used to count graphs held (a drop +
# recapture left it unchanged); it now counts capture calls, and warm-up passes repeat until none captures.
# 1) negative control of the sync test, done right: a BLOCKING host->device copy (what the old code did) added to
#    HiddenFeed.add must make test_backed_off_eagle3_steps_wait_on_the_device_no_more_than_plain_ones FAIL
#    (expected "1 failed"; run 2's control used torch.cuda.synchronize(), which sync debug mode does not flag).
# 2) the A/B again, arms plain / adaptive / fixed, 3 rounds: the final EAGLE-3 adaptive and fixed ratios.
mkdir -p $OUT/eagle
timeout 90 python3 - <<'PY' 2>&1 | grep -v " INFO " | tail -4 | tee $OUT/eagle/sync_test_negative_control.log
import sys, pytest, torch
from text_generator.speculative import hidden_feed
orig = hidden_feed.HiddenFeed.add
def add(self, rid, first, rows):
    torch.tensor([first]).to(rows.device)  # pageable -> device, non_blocking=False: a stream synchronize
    return orig(self, rid, first, rows)
hidden_feed.HiddenFeed.add = add
sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", "-m", "cuda", "tests/text_generator/test_eagle3_cuda.py",
                      "-k", "wait_on_the_device"]))
PY
timeout 170 python3 benchmarks/ab_eagle3_engine.py --rounds 3 --arms adaptive fixed 2>&1 \
  | grep -v " INFO \|it/s\]\|shard" | tee $OUT/eagle/ab_eagle3_engine.log
