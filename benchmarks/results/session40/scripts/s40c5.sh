# session 40 call c5: the engine, FP8 + FP8 KV under the old / new e4m3 decode launch tables (GPU0: old,new,old; GPU1: new,old,new), then bf16
source .gpu/device-setup.sh > $OUT/setup.log 2>&1; source benchmarks/fa3_fp8_env.sh >> $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt; NG=$(nvidia-smi -L | wc -l); G1=1; [ "$NG" -lt 2 ] && G1=0
( ORDER=old,new,old CUDA_VISIBLE_DEVICES=0 OMP_NUM_THREADS=4 timeout 300 taskset -c 0-15 python3 .probe/engab40.py 2>&1 | grep -v " INFO " > $OUT/eng0.log; echo "eng0 $(date +%T)" >> $OUT/rc.txt ) &
( ORDER=new,old,new CUDA_VISIBLE_DEVICES=$G1 OMP_NUM_THREADS=4 timeout 300 taskset -c 16-31 python3 .probe/engab40.py 2>&1 | grep -v " INFO " > $OUT/eng1.log; echo "eng1 $(date +%T)" >> $OUT/rc.txt ) &
wait
cat $OUT/gpus.txt $OUT/rc.txt; grep -hE "tok/s|COMPILE" $OUT/eng0.log $OUT/eng1.log | cut -c1-160 | head -30
