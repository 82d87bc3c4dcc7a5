# run helper requests in parallel on their own GPUs/cores: bash .probe/batch2.sh name[:gpus] ...  (trees = this tree + .wt/<name>.patch)
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
mkdir -p /tmp/bin && printf '#!/bin/sh\nexec python3 "$@"\n' > /tmp/bin/python && chmod +x /tmp/bin/python && export PATH=/tmp/bin:$PATH
python3 -m pip install -q --no-index --find-links .gpuserve fastapi uvicorn prometheus_client openai httpx > $OUT/pip.log 2>&1
nvidia-smi -L > $OUT/gpus.txt; ROOT=$(pwd)
for spec0 in "$@"; do spec=${spec0%:=}; name=${spec%%:*}; d=/tmp/wt/$name; mkdir -p $d
  tar -C $ROOT --exclude=./.wt --exclude=./.gpu --exclude=./.gpuserve --exclude=./.git --exclude=./benchmarks/results -cf - . | tar -C $d -xf -
  (cd $d && git apply --binary $ROOT/.wt/$name.patch && echo "$name patched" >> $OUT/rc.txt || echo "$name PATCH FAILED" >> $OUT/rc.txt)
  ln -s $ROOT/.gpu $d/.gpu; ln -s $ROOT/.gpuserve $d/.gpuserve; cp $ROOT/.wt/$name.request.sh $d/.request.sh; mkdir -p $d/benchmarks/results
done
n=0; for spec in "$@"; do case $spec in *:=) ;; *) n=$((n+1));; esac; done; cores=$(nproc); per=$((cores / n)); i=0; g=0
for spec in "$@"; do
  share=0; case $spec in *:=) share=1; spec=${spec%:=};; esac
  name=${spec%%:*}; gpus=${spec#*:}; [ "$gpus" = "$spec" ] && { gpus=$g; g=$((g+1)); }
  [ $share = 1 ] && i=$((i-1)); lo=$((i * per)); hi=$((lo + per - 1))
  omp="OMP_NUM_THREADS=4"; [ "$name" = serve ] && omp="TG_NOTHING=1"
  (cd /tmp/wt/$name && env $omp CUDA_VISIBLE_DEVICES=$gpus timeout ${JOB_TIMEOUT:-540} taskset -c $lo-$hi bash .request.sh > $OUT/$name.log 2>&1
   echo "$name rc=$? $(date +%T) gpus $gpus cores $lo-$hi" >> $OUT/rc.txt ) &
  i=$((i+1))
done
wait
cat $OUT/gpus.txt $OUT/rc.txt
cd $OUT && tar -czf /tmp/all.tgz --exclude=all.tgz . && find . -mindepth 1 -maxdepth 1 ! -name rc.txt -exec rm -rf {} + && mv /tmp/all.tgz $OUT/all.tgz
