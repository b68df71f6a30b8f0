-- The built-in load generator's mix, for wrk: 9 requests in 10 for one of 1,000 cacheable
-- objects, 1 in 10 for a no-store resource the proxy fetches from its origin each time.
--   wrk -t2 -c256 -d10s -s examples/showdown/mix.lua http://127.0.0.1:8080
local n = 0
request = function()
  n = n + 1
  local path
  if n % 10 == 0 then
    path = "/live/" .. n
  else
    path = "/objects/" .. (n % 1000)
  end
  return wrk.format("GET", path)
end
