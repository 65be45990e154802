# Bar chart of bench/run.py's transfers/s, one bar per configuration.
# gnuplot -e "datafile='...'; outfile='...'; subtitle='...'" bench/throughput.gp
# datafile lines: "label" transfers_per_s group (1 = a, 2 = b, ... 8 = h)
set terminal pngcairo size 1300,600 font ",10"
set output outfile
set title "sagapool vs plain ACID (a) and the naive 2PC recipe (b): transfers/s\n{/*0.8 ".subtitle."}"
set style fill solid 0.85 border -1
set boxwidth 0.7
set grid ytics
set key off
set ylabel "transfers/s"
set yrange [0:*]
set xtics rotate by -30 nomirror
set offsets 0.5, 0.5, 0, 0
# room for the last rotated label
set rmargin 16
set palette defined (1 "#9e9e9e", 2 "#616161", 3 "#1565c0", 4 "#2e7d32", 5 "#ef6c00", 6 "#6a1b9a", 7 "#00838f", 8 "#795548")
set cbrange [1:8]
unset colorbox
plot datafile using 0:2:3:xtic(1) with boxes lc palette, \
     "" using 0:2:(sprintf("%.0f", $2)) with labels offset 0,0.7 font ",9"
