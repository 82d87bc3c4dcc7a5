# run 4 jobs of main's tree on 4 GPUs: bash .probe/main4.sh  (jobs = .probe/job0.sh .. job3.sh)
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
mkdir -p /tmp/bin && printf '#!/bin/sh\nexec python3 "$@"\n' > /tmp/bin/python && chmod +x /tmp/bin/python && export PATH=/tmp/bin:$PATH
python3 -m pip install -q --no-index --find-links .gpuserve fastapi uvicorn prometheus_client openai httpx > $OUT/pip.log 2>&1
nvidia-smi -L > $OUT/gpus.txt; ROOT=$(pwd); n=$(ls .probe/job*.sh | wc -l); per=$(( $(nproc) / n )); i=0
for j in .probe/job*.sh; do name=$(basename $j .sh); d=/tmp/wt/$name; mkdir -p $d
  tar -C $ROOT --exclude=./.gpu --exclude=./.gpuserve --exclude=./benchmarks/results -cf - . | tar -C $d -xf -
  ln -s $ROOT/.gpu $d/.gpu 2>/dev/null; lo=$((i*per)); hi=$((lo+per-1))
  (cd $d && mkdir -p $OUT/$name && OUTJ=$OUT/$name OMP_NUM_THREADS=4 CUDA_VISIBLE_DEVICES=$i timeout ${JOB_TIMEOUT:-540} taskset -c $lo-$hi bash $ROOT/$j > $OUT/$name.log 2>&1
   echo "$name rc=$? $(date +%T) gpu $i cores $lo-$hi" >> $OUT/rc.txt) &
  i=$((i+1))
done
wait; cat $OUT/gpus.txt $OUT/rc.txt
