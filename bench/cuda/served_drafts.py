# Greedy chat completions from C concurrent clients, R requests each, on a fixed set of shell
# questions (lode-mini's drafts agree often on them): completion tokens, wall seconds and tokens/s
# in all. For the GPU machine's runs that carry the test pack (bench/cuda/pack.sh), which leaves no
# room in the carry for Node and tools/load; docs/MTP.md's served drafts were measured with it:
#
#   python3 bench/cuda/served_drafts.py http://127.0.0.1:8091 C R MAX_TOKENS
import json, sys, threading, time, urllib.request
url, c, r, max_tokens = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
questions = ["How do I list the files of a folder?", "How do I copy a file?", "What does the ls command do?",
             "How do I find a file by name?", "How do I see the disk usage of a folder?", "How do I move a file?",
             "How do I count the lines of a file?", "How do I show the end of a log file?"]
tokens, errors = [0], [0]
lock = threading.Lock()
def client(k):
    for j in range(r):
        body = json.dumps({"messages": [{"role": "user", "content": questions[(k * r + j) % len(questions)]}],
                           "max_tokens": max_tokens, "temperature": 0}).encode()
        try:
            req = urllib.request.Request(url + "/v1/chat/completions", body, {"Content-Type": "application/json"})
            reply = json.load(urllib.request.urlopen(req, timeout=120))
            with lock: tokens[0] += reply["usage"]["completion_tokens"]
        except Exception as e:
            with lock: errors[0] += 1
start = time.time()
threads = [threading.Thread(target=client, args=(k,)) for k in range(c)]
for t in threads: t.start()
for t in threads: t.join()
wall = time.time() - start
print(f"c{c}: {tokens[0]} tokens in {wall:.2f} s, {tokens[0] / wall:.1f} tokens/s, {errors[0]} errors")
