-- wrk script: submissions with keys made from a prefix, the thread and a counter.
-- wrk ... -s bench/submit.lua URL -- MODE SESSIONS_FILE PREFIX CYCLE
--   MODE      graphql (Keyturn submitTurn) or rest (the peer's POST /sessions/{id}/turns)
--   PREFIX    makes the keys of this run unique
--   CYCLE     0 for new keys; N > 0 replays keys 1..N of an earlier run with the same PREFIX
--             (wrk calls request() once before the run to check it, and never sends that
--             request: key 0 of a run is never sent, so replays leave it out)
-- Request n goes to session n mod #sessions, so a replay hits the key's own session.
-- done() prints one JSON line: throughput, latency percentiles, answers by kind.

local threads = {}

function setup(thread)
  thread:set("tid", #threads + 1)
  table.insert(threads, thread)
end

local QUERY = "mutation($i: SubmitTurnInput!) { submitTurn(input: $i) { __typename "
  .. "... on TurnAdmission { turn { id status } } ... on UserError { code } } }"

function init(args)
  mode = args[1]
  sessions = {}
  for line in io.lines(args[2]) do
    if #line > 0 then sessions[#sessions + 1] = line end
  end
  prefix = args[3] .. "-" .. tid
  cycle = tonumber(args[4]) or 0
  counter = 0
  issued = 0
  accepted = 0
  replayed = 0
  other = 0
  gql_headers = { ["Content-Type"] = "application/json" }
end

function request()
  local n = counter
  counter = counter + 1
  issued = counter
  if cycle > 0 then n = 1 + n % cycle end
  local sid = sessions[(n % #sessions) + 1]
  local key = prefix .. "-" .. n
  local text = "hello " .. n
  if mode == "graphql" then
    local body = '{"query":"' .. QUERY .. '","variables":{"i":{"sessionId":"' .. sid
      .. '","idempotencyKey":"' .. key .. '","input":"' .. text .. '"}}}'
    return wrk.format("POST", "/graphql", gql_headers, body)
  end
  local headers = { ["Content-Type"] = "application/json", ["Idempotency-Key"] = key }
  return wrk.format("POST", "/sessions/" .. sid .. "/turns", headers, '{"input":"' .. text .. '"}')
end

function response(status, headers, body)
  if mode == "graphql" then
    if status == 200 and string.find(body, '"TurnAccepted"', 1, true) then
      accepted = accepted + 1
    elseif status == 200 and string.find(body, '"TurnReplayed"', 1, true) then
      replayed = replayed + 1
    else
      other = other + 1
    end
  elseif status == 202 then
    accepted = accepted + 1
  elseif status == 200 then
    replayed = replayed + 1
  else
    other = other + 1
  end
end

function done(summary, latency, requests)
  local a, r, o, i = 0, 0, 0, 0
  for _, t in ipairs(threads) do
    a = a + t:get("accepted")
    r = r + t:get("replayed")
    o = o + t:get("other")
    i = i + t:get("issued")
  end
  local e = summary.errors
  io.write(string.format(
    '{"requests":%d,"duration_us":%d,"issued":%d,"accepted":%d,"replayed":%d,"other":%d,'
      .. '"errors":%d,"p50_us":%d,"p90_us":%d,"p99_us":%d,"max_us":%d,"mean_us":%.1f}\n',
    summary.requests, summary.duration, i, a, r, o,
    e.connect + e.read + e.write + e.status + e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99),
    latency.max, latency.mean))
end
