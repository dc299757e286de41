-- wrk hot loop for the Manifold benchmark: POSTs one prepared JSON-RPC request over and over and checks
-- every answer. The Python side (bench/loadgen.py) does the MCP handshake and writes a parameter file
-- (a Lua chunk returning a table), named by $MCP_BENCH_PARAMS:
--   heads    list of request heads, one per session: "POST /mcp HTTP/1.1\r\nHost: ...\r\n...Content-Length: N\r\n\r\n"
--   prefix   body up to the request id;  suffix: body after it (the id always has 10 digits, so N is fixed)
--   expect   a string every good answer contains (e.g. '"result":')
--   min_bytes  the shortest good body
--   check_body  false: define no response() at all (see below)
-- An answer is an error when its status is not 200, when it lacks `expect`, when it carries a JSON-RPC
-- error or an `"isError":true` result, or when it is shorter than min_bytes. SSE and JSON bodies both work:
-- the checks are substring searches over the whole body.
-- With check_body false (used for the 1 MiB results), wrk hands no body to Lua, which saves it about 1 ms of
-- CPU per MiB (it copies every body into a fresh Lua string). Errors are then the non-2xx statuses plus
-- the other answers that cannot have been full-size: requests - floor(bytes read / min_bytes) - statuses.
-- Any error answer (a JSON-RPC error, an isError result) is tiny next to min_bytes, so each one shows up
-- as a missing full-size answer; only up to one partial answer per connection at the end can hide one.
-- The benchmark's warm-up runs of such a target check every body.
-- done() prints one line "BENCHJSON {...}" with counts and latency percentiles (microseconds).

local params = dofile(os.getenv("MCP_BENCH_PARAMS"))
local heads = params.heads
local nheads = #heads
local prefix = params.prefix
local suffix = params.suffix
local expect = params.expect
local min_bytes = params.min_bytes or 0
local check_body = params.check_body ~= false
local find = string.find

local threads = {}
local counter = 0
local base = 1000000000

-- per-thread counters (each wrk thread has its own Lua state)
bad_status = 0
bad_rpc = 0
bad_tool = 0
bad_short = 0
answers = 0

function setup(thread)
   thread:set("tid", #threads)
   table.insert(threads, thread)
end

function init(args)
   base = 1000000000 + (tid or 0) * 100000000
end

function request()
   counter = counter + 1
   local head = heads[(counter % nheads) + 1]
   return head .. prefix .. (base + counter) .. suffix
end

local function check(status, headers, body)
   answers = answers + 1
   body = body or ""
   if status ~= 200 then
      bad_status = bad_status + 1
   elseif not find(body, expect, 1, true) or find(body, '"error":', 1, true) then
      bad_rpc = bad_rpc + 1
   elseif find(body, '"isError":true', 1, true) or find(body, '"isError": true', 1, true) then
      bad_tool = bad_tool + 1
   elseif #body < min_bytes then
      bad_short = bad_short + 1
   end
end

if check_body then
   response = check  -- wrk buffers bodies only when a global response() exists
end

function done(summary, latency, requests)
   local s, r, t, sh, a = 0, 0, 0, 0, 0
   for _, thread in ipairs(threads) do
      s = s + thread:get("bad_status")
      r = r + thread:get("bad_rpc")
      t = t + thread:get("bad_tool")
      sh = sh + thread:get("bad_short")
      a = a + thread:get("answers")
   end
   local e = summary.errors
   if not check_body then
      a = summary.requests
      s = e.status
      if min_bytes > 0 then
         sh = math.max(0, summary.requests - math.floor(summary.bytes / min_bytes) - s)
      end
   end
   io.write(string.format(
      'BENCHJSON {"requests":%d,"duration_us":%d,"bytes":%d,"answers":%d,' ..
      '"bad_status":%d,"bad_rpc":%d,"bad_tool":%d,"bad_short":%d,' ..
      '"connect":%d,"read":%d,"write":%d,"status":%d,"timeout":%d,' ..
      '"lat_min":%d,"lat_mean":%.1f,"lat_max":%d,"p50":%d,"p90":%d,"p99":%d}\n',
      summary.requests, summary.duration, summary.bytes, a, s, r, t, sh,
      e.connect, e.read, e.write, e.status, e.timeout,
      latency.min, latency.mean, latency.max,
      latency:percentile(50), latency:percentile(90), latency:percentile(99)))
end
