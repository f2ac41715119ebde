-- wrk script: cycles through requests read from a file, one per line:
--   METHOD<TAB>PATH<TAB>BODY (BODY may be empty; it is sent as application/json)
-- wrk ... -s bench/cycle.lua URL -- REQUESTS_FILE
-- done() prints one JSON line: throughput, latency percentiles, non-200 answers.

local threads = {}

function setup(thread)
  thread:set("tid", #threads + 1)
  table.insert(threads, thread)
end

function init(args)
  reqs = {}
  local headers = { ["Content-Type"] = "application/json" }
  for line in io.lines(args[1]) do
    local method, path, body = string.match(line, "^([^\t]*)\t([^\t]*)\t(.*)$")
    if method then
      if body == "" then body = nil end
      reqs[#reqs + 1] = wrk.format(method, path, headers, body)
    end
  end
  counter = tid - 1
  other = 0
end

function request()
  counter = counter + 1
  return reqs[(counter % #reqs) + 1]
end

function response(status, headers, body)
  if status ~= 200 or string.find(body, '"errors"', 1, true) then other = other + 1 end
end

function done(summary, latency, requests)
  local o = 0
  for _, t in ipairs(threads) do o = o + t:get("other") end
  local e = summary.errors
  io.write(string.format(
    '{"requests":%d,"duration_us":%d,"other":%d,"errors":%d,'
      .. '"p50_us":%d,"p90_us":%d,"p99_us":%d,"max_us":%d,"mean_us":%.1f}\n',
    summary.requests, summary.duration, o,
    e.connect + e.read + e.write + e.status + e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99),
    latency.max, latency.mean))
end
