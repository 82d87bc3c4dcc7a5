import re, sys
for f in sys.argv[1:]:
    lines = open(f).read().splitlines()
    addr = {}
    ins = []
    for l in lines:
        m = re.match(r"\s+/\*([0-9a-f]+)\*/\s+(.*?);", l)
        if m: ins.append((int(m.group(1), 16), m.group(2)))
    best = None
    for a, t in ins:
        m = re.search(r"BRA\s+(?:`\(\.L_x_\d+\)|0x([0-9a-f]+))", t)
        m2 = re.search(r"BRA.*\.L_x_(\d+)", t)
    # labels
    text = open(f).read()
    labels = {}
    cur = None
    for l in lines:
        m = re.match(r"\.L_x_(\d+):", l.strip())
        if m: cur = m.group(1); continue
        m = re.match(r"\s+/\*([0-9a-f]+)\*/", l)
        if m and cur is not None: labels[cur] = int(m.group(1), 16); cur = None
    loops = []
    for a, t in ins:
        m = re.search(r"BRA.*\.L_x_(\d+)", t)
        if m and m.group(1) in labels and labels[m.group(1)] < a:
            n = sum(1 for b, _ in ins if labels[m.group(1)] <= b <= a)
            loops.append(n)
    print(f, "backward loops (instr):", loops)
