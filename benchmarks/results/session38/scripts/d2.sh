source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt; ROOT=$(pwd)
d=/tmp/wt/ctmoe; mkdir -p $d
tar -C $ROOT --exclude=./.gpu --exclude=./.fiextra --exclude=./benchmarks/results -cf - . | tar -C $d -xf -
ln -s $ROOT/.gpu $d/.gpu
(cd $d && git apply --whitespace=nowarn $ROOT/.wt/ctmoe.patch > $OUT/apply.log 2>&1; CUDA_VISIBLE_DEVICES=0 timeout 300 python3 .probe/ctdiag.py 2>&1 | grep -E "^ROW|Error" > $OUT/ctdiag.log) &
(CUDA_VISIBLE_DEVICES=1 timeout 200 python3 .probe/onlinediag.py 2>&1 | grep -E "^ONL|Error|   first" > $OUT/onlinediag.log) &
wait
cat $OUT/onlinediag.log $OUT/ctdiag.log | cut -c1-250
