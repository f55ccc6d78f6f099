import asyncio, time, os, numpy as np, uvloop
from tests.test_workers import started, request
def cpu(pid):
    f = open(f"/proc/{pid}/stat").read().rsplit(")",1)[1].split()
    return (int(f[11])+int(f[12]))/os.sysconf("SC_CLK_TCK")
async def main():
    ex = await started("Echo", 1)
    wpid = ex.pool.workers[0].pid
    r = request(np.arange(4, dtype=np.float32))
    for _ in range(300): await ex.call_predict(r)
    N=600
    t = time.process_time(); w = time.perf_counter(); wc = cpu(wpid)
    for _ in range(N): await asyncio.gather(*(ex.call_predict(r) for _ in range(8)))
    n=N*8
    print("server cpu us/req", round((time.process_time()-t)/n*1e6,1), "worker cpu us/req", round((cpu(wpid)-wc)/n*1e6,1), "wall us/req", round((time.perf_counter()-w)/n*1e6,1))
    await ex.stop()
uvloop.run(main())
