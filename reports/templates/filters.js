(function () {
  var form = document.getElementById("filters");
  if (!form) { return; }
  form.hidden = false;
  var rows = Array.prototype.slice.call(document.querySelectorAll("tr[data-status]"));
  var shown = document.getElementById("shown");
  function apply() {
    var want = {};
    Array.prototype.forEach.call(form.querySelectorAll("input[name=status]"), function (b) { want[b.value] = b.checked; });
    var tag = form.querySelector("select[name=tag]").value;
    var n = 0;
    rows.forEach(function (tr) {
      var tags = JSON.parse(tr.getAttribute("data-tags") || "[]");
      var ok = want[tr.getAttribute("data-status")] && (tag === "" || tags.indexOf(tag) >= 0);
      tr.hidden = !ok;
      if (ok) { n += 1; }
    });
    shown.textContent = n + " of " + rows.length + " cases shown";
  }
  form.addEventListener("change", apply);
  apply();
})();
